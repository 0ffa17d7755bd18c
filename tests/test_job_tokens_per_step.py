"""A job's tokens per step are the step's whole token count, not its rate times its time in floating point."""

from __future__ import annotations

from types import SimpleNamespace

from simulator.reliability import states


def test_tokens_per_step_is_the_whole_count_the_rate_was_made_of():
    step_s = 3.5529206381356233  # 4194304 / step_s * step_s is 4194303.9999999995 in floating point
    tokens = 512 * 8192
    summary = {"step_time_s": step_s, "tokens_per_s": tokens / step_s, "exposed_comm_s": {},
               "layout": {"dp": 64, "microbatches": 8}}
    topology = SimpleNamespace(host_nic_bandwidth=400e9, gpu_domain=[0, 1], num_hosts=2, num_gpus=16)
    assert states._step_state(summary, topology).tokens_per_step == tokens
