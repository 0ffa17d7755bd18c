"""The virtual stage (`chunk`) data-parallel collectives carry into the timeline, as docs/outputs.md says: FSDP's
gathers and reduce-scatters of one virtual stage's units carry that stage, the collectives of a rank's whole
model (DDP's buckets) none."""

from __future__ import annotations

import re

from simulator.config.loader import scenario_from_text
from simulator.program.ops import CollectiveOp
from simulator.simulation import step_program
from simulator.topology.loader import scenario_topology

INTERLEAVED = """
cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 8}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {pp: 2, dp: 4, pipeline: {schedule: interleaved, virtual_stages: 2}}
"""


def _dp_collectives(sharding: str) -> list[CollectiveOp]:
    loaded = scenario_from_text(INTERLEAVED, "inline.yaml", [sharding])
    ops = step_program(loaded, scenario_topology(loaded), fold=True).ops
    return [op for op in ops if isinstance(op, CollectiveOp) and op.category == "dp"]


def test_fsdp_s_unit_collectives_carry_their_units_virtual_stage():
    ops = _dp_collectives("parallelism.fsdp=full_shard")
    staged = [(op.chunk, int(found.group(1))) for op in ops if (found := re.search(r"\.vs(\d+)", op.key))]
    assert staged and all(chunk == stage for chunk, stage in staged)
    assert {op.chunk for op in ops} == {0, 1, 2, 3}


def test_ddp_s_buckets_carry_no_virtual_stage():
    ops = _dp_collectives("parallelism.zero=0")
    assert ops and {op.chunk for op in ops} == {-1}
