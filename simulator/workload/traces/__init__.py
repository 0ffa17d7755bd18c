"""Trace importers: PyTorch profiler (Kineto) and Chakra execution traces, read into traced ranks
(model.py) and turned into a step program (program.py)."""
