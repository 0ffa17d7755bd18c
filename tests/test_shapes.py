"""The index of a program's collective shapes (engine/shapes.py) that the analyses before a run share."""

from __future__ import annotations

from test_periods import _folded
from test_replicas import CP_FABRIC

from simulator.engine.shapes import CollectiveShapes, plan_key
from simulator.program.ops import CollectiveOp


def test_each_op_is_indexed_under_the_first_op_with_its_plan_key():
    """Every collective op, in program order, points at the first op whose plan key (its group by value) is
    its own, and each shape's group id names its group: as many shapes as distinct keys."""
    program, _, _ = _folded(CP_FABRIC)
    shapes = CollectiveShapes.of(program.ops)
    collectives = [op for op in program.ops if isinstance(op, CollectiveOp)]
    assert list(shapes.ops) == collectives
    firsts: dict[tuple, CollectiveOp] = {}
    for op in collectives:
        firsts.setdefault(plan_key(op, op.group), op)
    assert list(shapes.firsts) == list(firsts.values())
    groups = {}
    for index, op in enumerate(collectives):
        first = shapes.firsts[shapes.shape_of[index]]
        assert plan_key(first, first.group) == plan_key(op, op.group)
        assert groups.setdefault(shapes.group_of(index), op.group) == op.group
    assert len(set(groups.values())) == len(groups)
