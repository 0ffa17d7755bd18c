"""The program seam: the op IR and the frozen step program every workload source produces."""
