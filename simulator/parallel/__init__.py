"""The parallel layout and the per-rank step program built from it: TP, CP, PP, DP, ZeRO/FSDP, experts and
rank folding."""
