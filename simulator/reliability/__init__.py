"""The job simulated over weeks: failures, checkpoints, restarts and elastic resizing (docs/reliability.md)."""
