"""Outputs: summary.json, timeline, Chrome trace, run folders and their manifests, and the charts."""
