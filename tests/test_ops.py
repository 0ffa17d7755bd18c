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
        *OP, "op", "group", "nbytes", "key", "algorithm", "protocol", "root", "mirrors", "pair_bytes", "sms", "copies"]


def test_the_defaults_the_builder_passes_by_position_are_the_fields_defaults():
    """Passing by position, the builder writes the defaults it leaves alone as literals (`_compute`: 0.0
    hbm_bytes; `_collective`: root 0): a default changed here would not reach the ops it builds."""
    compute = {field.name: field.default for field in fields(ComputeOp)}
    collective = {field.name: field.default for field in fields(CollectiveOp)}
    assert (compute["hbm_bytes"], collective["root"]) == (0.0, 0)
