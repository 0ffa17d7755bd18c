"""Data the cost model reads: GPU, model and failure presets, kernel and SHARP calibration (kernels.yaml)."""
