"""Workload sources of the step program: the transformer model (kernels, roofline, memory), communication
lists and traces."""
