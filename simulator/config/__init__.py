"""Scenario files: safe YAML with a line table, the pydantic schema and its option sets, overrides, and
errors located at FILE:LINE."""
