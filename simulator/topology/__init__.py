"""Clusters: builders list the nodes and links, graph.py compiles them into arrays and routes."""
