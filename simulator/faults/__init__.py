"""Faults inside one simulated step: stragglers, degraded and failed links, failed GPUs (docs/faults.md)."""
