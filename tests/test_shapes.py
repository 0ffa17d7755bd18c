"""The index of a program's collective shapes (engine/shapes.py) that the analyses before a run share."""

from __future__ import annotations

from shared import CP_FABRIC, step_program_and_plans

from simulator.engine.shapes import CollectiveShapes, plan_key
from simulator.program.ops import CollectiveOp, ComputeOp


def test_each_op_is_indexed_under_the_first_op_with_its_plan_key():
    """Every collective op, in program order, points at the first op whose plan key (its group by value) is
    its own, and each shape's group id names its group: as many shapes as distinct keys."""
    program, _, _ = step_program_and_plans(CP_FABRIC)
    shapes = CollectiveShapes.of(program.ops)
    collectives = [op for op in program.ops if isinstance(op, CollectiveOp)]
    assert list(shapes.ops) == collectives
    firsts: dict[tuple, CollectiveOp] = {}
    for op in collectives:
        firsts.setdefault(plan_key(op, op.group, op.pair_bytes), op)
    assert list(shapes.firsts) == list(firsts.values())
    groups = {}
    for index, op in enumerate(collectives):
        shape = shapes.shape_of[index]
        first = shapes.firsts[shape]
        assert plan_key(first, first.group, first.pair_bytes) == plan_key(op, op.group, op.pair_bytes)
        assert groups.setdefault(shapes.group_of_shape[shape], op.group) == op.group
    assert len(set(groups.values())) == len(groups)


def _pairs(scale: float) -> tuple[tuple[float, ...], ...]:
    """A 4 x 4 all-to-all's pair sizes, a new object each call."""
    return tuple(tuple(scale * (4 * src + dst) for dst in range(4)) for src in range(4))


def test_equal_groups_and_pair_sizes_held_as_distinct_objects_are_one_shape():
    """Nine collectives by hand, a compute op among them: equal groups and equal pair sizes held as distinct
    tuple objects index alike, while another size, algorithm, root, op, group or pair sizes is a shape of its
    own; shapes are numbered in order of first appearance, group ids too."""
    group, pairs = tuple(range(4)), _pairs(1.0)
    same_group, same_pairs, other_pairs = tuple(range(4)), _pairs(1.0), _pairs(2.0)
    assert same_group is not group and same_pairs is not pairs and same_pairs == pairs

    def collective(op: str, members, **fields) -> CollectiveOp:
        nbytes = fields.pop("nbytes", 8e6)
        return CollectiveOp(id=0, rank=0, stream="comm", name=op, op=op, group=members, nbytes=nbytes, **fields)

    ops = [collective("all_to_all", group, pair_bytes=pairs),
           ComputeOp(id=1, rank=0, stream="compute", name="matmul", duration=1e-3),
           collective("all_to_all", same_group, pair_bytes=same_pairs),
           collective("all_to_all", group, pair_bytes=other_pairs),
           collective("all_reduce", group),
           collective("all_reduce", (4, 5, 6, 7)),
           collective("all_reduce", same_group),
           collective("all_reduce", group, algorithm="ring"),
           collective("all_reduce", group, nbytes=4e6),
           collective("reduce", same_group, root=2),
           collective("all_to_all", same_group, pair_bytes=_pairs(2.0))]
    shapes = CollectiveShapes.of(ops)
    assert shapes.ops == tuple(ops[:1] + ops[2:])
    assert shapes.shape_of == (0, 0, 1, 2, 3, 2, 4, 5, 6, 1)
    assert shapes.firsts == (ops[0], ops[3], ops[4], ops[5], ops[7], ops[8], ops[9])
    assert shapes.group_of_shape == (0, 0, 0, 1, 0, 0, 0)


class _CountedPairs(tuple):
    """Pair sizes that count how often they are hashed."""

    hashed = 0

    def __hash__(self) -> int:
        _CountedPairs.hashed += 1
        return super().__hash__()


def test_pair_sizes_are_hashed_when_first_met_not_once_per_op():
    """A thousand all-to-alls sharing one pair-size object (as the builder hands an expert layer's ops one
    matrix): the matrix, ep x ep floats, is hashed as often as for one such op, not once per op."""
    pairs = _CountedPairs(_pairs(1.0))
    ops = [CollectiveOp(id=index, rank=index % 4, stream="comm", name="dispatch", op="all_to_all",
                        group=(0, 1, 2, 3), nbytes=8e6, pair_bytes=pairs) for index in range(1000)]
    counts = []
    for count in (1, 1000):
        _CountedPairs.hashed = 0
        assert CollectiveShapes.of(ops[:count]).shape_of == (0,) * count
        counts.append(_CountedPairs.hashed)
    assert counts[0] == counts[1] <= 2
