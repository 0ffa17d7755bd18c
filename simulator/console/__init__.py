"""What the command line prints: the tables after a run, progress on a terminal, output paths checked first."""
