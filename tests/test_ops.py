"""The op IR's field order, which the program builder relies on: parallel/program.py passes `ComputeOp` and
`CollectiveOp` fields by position (keywords took a fifth of a large program's build), so a field moved or added
before the last would shift its values into the wrong fields silently where their types agree."""

from __future__ import annotations

from dataclasses import fields

from simulator.program.ops import CollectiveOp, ComputeOp

OP = ["id", "rank", "stream", "name", "deps", "category", "microbatch", "chunk"]


def test_compute_op_fields_keep_the_order_the_builder_passes():
    assert [field.name for field in fields(ComputeOp)] == [
        *OP, "duration", "flops", "hbm_bytes", "sm_bound_share", "reserved_sms"]


def test_collective_op_fields_keep_the_order_the_builder_passes():
    assert [field.name for field in fields(CollectiveOp)] == [
        *OP, "op", "group", "nbytes", "key", "algorithm", "protocol", "root", "mirrors", "pair_bytes", "sms"]
