"""A program's collective ops indexed once by shape, for the analyses a run makes before its clock starts.

The fold symmetry check, the sharing analysis, the replica quotient and the folded send excess each work once
per distinct collective shape (what a plan depends on, `plan_key`, its group and pair sizes named by dense
`GroupIds` ids) and hand their verdicts back per op. Walking the ops and hashing their groups once, here,
instead of once per analysis, is both the simpler and the cheaper way round: a folded long-context step has
47 k collective ops of a few hundred shapes. The ops of one shape carry the same mirrors (a function of the group).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from simulator.engine.groups import GroupIds
from simulator.program.ops import CollectiveOp, Op


def plan_key(op: CollectiveOp, group: Hashable, pairs: Hashable) -> tuple:
    """What a plan depends on within one run: op, group, size, pair sizes, root and the algorithm and protocol
    asked for (`auto` is resolved from these and the run's fixed defaults). ``group`` is the member tuple or anything
    naming it one to one (a dense group id: cheaper to hash than a 16k-rank tuple), ``pairs`` likewise
    ``op.pair_bytes`` (an ep x ep matrix of an uneven all-to-all) or its dense id."""
    return (op.op, group, op.nbytes, op.root, op.algorithm, op.protocol, pairs)


@dataclass(frozen=True)
class CollectiveShapes:
    """The collective ops of a program in program order (``ops``), each op's shape as an index
    (``shape_of``), and per shape its first op (``firsts``) and its group's dense id (``group_of_shape``)."""

    ops: tuple[CollectiveOp, ...]
    shape_of: tuple[int, ...]
    firsts: tuple[CollectiveOp, ...]
    group_of_shape: tuple[int, ...]

    @staticmethod
    def of(ops: Sequence[Op]) -> CollectiveShapes:
        """The index of ``ops``' collectives (compute ops are left out). Groups and pair sizes are keyed by
        dense ids found by object identity first (`GroupIds`): the builder hands the ops of one group or one
        expert routing the same few tuple objects, so each is hashed once, not once per op; an op without pair
        sizes (all but an uneven all-to-all) is keyed -1 without a lookup."""
        group_id = GroupIds().id
        pairs_id = GroupIds().id
        index: dict[tuple, int] = {}
        collectives = [op for op in ops if isinstance(op, CollectiveOp)]
        firsts: list[CollectiveOp] = []
        groups: list[int] = []
        shape_of = []
        for op in collectives:
            gid = group_id(op.group)
            key = plan_key(op, gid, pairs_id(op.pair_bytes) if op.pair_bytes else -1)
            shape = index.get(key)
            if shape is None:
                shape = index[key] = len(firsts)
                firsts.append(op)
                groups.append(gid)
            shape_of.append(shape)
        return CollectiveShapes(tuple(collectives), tuple(shape_of), tuple(firsts), tuple(groups))
