"""The process group of each traced communication op whose own record does not name one, settled across the
traced ranks before their ops are matched.

A process group's name is the same on every member (torch.distributed names a group alike on all its ranks), and a
send meets its receive only in one communicator, so the two ends of a transfer are in one group: an end whose
record names none (a Chakra node without `pg_name` or a launching node naming one, a Kineto kernel without `Process
Group Name`, and process-group metadata listing several groups or none) takes the group that the other ends between
the same two ranks name, where they name one; an end in the only group its rank's metadata lists (an inference: the
metadata lists the groups the rank was a member of when it was recorded) takes a different group that an end's own
record names, with a warning; an end that could be in either of two named groups is refused, as are ends that no
end between the same two ranks names a group for, whose ranks' metadata list different only groups, and
collectives taken in their rank's only group where a member of it runs none of that group's and takes its own in
another only group. A collective
whose record names no group is in the group of every collective that names none, of the ranks that run them, where
no trace names a process group at all (a hand-written trace) and they describe their group alike (Kineto's `Process
Group Description`, none in Chakra), with a warning; beside named groups, or described differently, it is refused:
a description is not a name (descriptions repeat: PyTorch describes every group made without one `undefined`)."""

from __future__ import annotations

from dataclasses import replace

from simulator.workload.traces.model import TracedOp, TracedRank, trace_error

UNNAMED_GROUP = "default"
"""The group of collectives in traces that name no process group."""
GROUP_ALLOWED = ("the op's process group: pg_name on the node, or its launching record_param_comms node naming "
                 "it (Chakra); Process Group Name (Kineto); or process-group metadata (pg_config) listing one group")


def settled_groups(traced: list[TracedRank]) -> tuple[list[TracedRank], tuple[str, ...]]:
    """``traced`` with every communication op's process group settled (the module's rules), and the warnings
    for the groups taken: one per file and pair of groups where other ends overrule inferred ones, one for
    unnamed collectives."""
    ops = [list(rank.ops) for rank in traced]
    warnings = _settle_transfers(traced, ops)
    _refuse_collectives_inferred_apart(traced, ops)
    warnings += _settle_collectives(traced, ops)
    return [replace(rank, ops=tuple(rank_ops)) for rank, rank_ops in zip(traced, ops, strict=True)], warnings


def _settle_transfers(traced: list[TracedRank], ops: list[list[TracedOp]]) -> tuple[str, ...]:
    """Settle the group of each transfer end between two traced ranks from the ends between the same two (in
    ``ops``, by rank index, in place); one warning per file, inferred group and group taken instead."""
    place = {rank.rank: index for index, rank in enumerate(traced)}
    pairs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for index, rank in enumerate(traced):
        for position, op in enumerate(rank.ops):
            if op.kind in ("send", "recv") and op.peer in place:
                pair = (rank.rank, op.peer) if op.kind == "send" else (op.peer, rank.rank)
                pairs.setdefault(pair, []).append((index, position))
    overruled: dict[tuple[int, str, str], list[tuple[TracedOp, int, TracedOp]]] = {}
    for (src, dst), ends in pairs.items():
        told = [end for end in ends if ops[end[0]][end[1]].group and not ops[end[0]][end[1]].group_inferred]
        tellers = told or [end for end in ends if ops[end[0]][end[1]].group]
        groups = list(dict.fromkeys(ops[index][position].group for index, position in tellers))
        if not told and len(groups) > 1:
            _refuse_inferred_apart(traced, ops, tellers)
        if len(groups) > 1:
            for index, position in ends:
                op = ops[index][position]
                if op.group not in groups:
                    raise trace_error(traced[index].file, traced[index].where(op), f"{op.kind} {op.name!r} names no "
                                      f"process group{_inferred(op)}, and the transfers from rank {src} to rank {dst} "
                                      f"are in {len(groups)} ({', '.join(map(repr, groups))}): which is its "
                                      "communicator is unknown", GROUP_ALLOWED)
            continue
        if not groups:
            continue
        teller_index, teller_position = tellers[0]
        teller = ops[teller_index][teller_position]
        for index, position in ends:
            op = ops[index][position]
            if op.group == teller.group:
                continue
            if op.group:
                overruled.setdefault((index, op.group, teller.group), []).append((op, teller_index, teller))
            ops[index][position] = replace(op, group=teller.group, description=teller.description,
                                           group_inferred=teller.group_inferred)
    return tuple(_overruled_warning(traced, index, inferred, taken, ends)
                 for (index, inferred, taken), ends in overruled.items())


def _refuse_inferred_apart(traced: list[TracedRank], ops: list[list[TracedOp]],
                           inferred: list[tuple[int, int]]) -> None:
    """Refuse the first of the ``inferred`` ends of one transfer (none naming its group in its own record) whose
    group differs from the first's: each rank's metadata lists another only group, so neither is its
    communicator for certain."""
    first_index, first_position = inferred[0]
    first = ops[first_index][first_position]
    index, position = next((index, position) for index, position in inferred
                           if ops[index][position].group != first.group)
    op, rank, other = ops[index][position], traced[index], traced[first_index]
    raise trace_error(rank.file, rank.where(op), f"{op.kind} {op.name!r} names no process group and is taken in "
                      f"{op.group!r}, the only group its rank's process-group metadata lists ({rank.groups_field}), "
                      f"but rank {other.rank}'s {first.kind} {first.name!r} ({other.file}: {other.where(first)}) in "
                      f"{first.group!r}, the only group in {other.file}: {other.groups_field}; no end between the "
                      "two ranks names its group: which is their communicator is unknown", GROUP_ALLOWED)


def _refuse_collectives_inferred_apart(traced: list[TracedRank], ops: list[list[TracedOp]]) -> None:
    """Refuse the collectives of a rank whose record names no group, taken in the only group its metadata lists,
    where a member of that group runs none of that group's collectives and takes its own unnamed ones in
    another only group: each rank's metadata lists another group, so neither is their communicator for
    certain (matching would fail later, as a collective without a counterpart). Refused at the member's first."""
    place = {rank.rank: index for index, rank in enumerate(traced)}
    inferred: dict[int, TracedOp] = {}  # rank index -> its first collective in an inferred group
    for index, rank_ops in enumerate(ops):
        first = next((op for op in rank_ops if op.kind == "collective" and op.group_inferred), None)
        if first is not None:
            inferred[index] = first
    for index, first in inferred.items():
        for member in first.members:
            other = place.get(member, index)
            if other == index or other not in inferred or any(
                    op.kind == "collective" and op.group == first.group for op in ops[other]):
                continue
            op, rank, named = inferred[other], traced[other], traced[index]
            raise trace_error(rank.file, rank.where(op), f"collective {op.name!r} names no process group and is "
                              f"taken in {op.group!r}, the only group its rank's process-group metadata lists "
                              f"({rank.groups_field}), but rank {named.rank}'s collective {first.name!r} "
                              f"({named.file}: {named.where(first)}) in {first.group!r} of ranks "
                              f"{list(first.members)}, the only group in {named.file}: {named.groups_field}, and "
                              f"rank {rank.rank} runs no collective of {first.group!r}: which is their "
                              "communicator is unknown", GROUP_ALLOWED)


def _overruled_warning(traced: list[TracedRank], index: int, inferred: str, taken: str,
                       ends: list[tuple[TracedOp, int, TracedOp]]) -> str:
    """The warning for the transfer ends of rank ``index`` in ``inferred``, the only group of its metadata, taken
    in ``taken`` that ends between the same ranks name: how many, and the first with an end naming its group."""
    rank, (first, teller_index, teller) = traced[index], ends[0]
    count = f"{len(ends)} sends or receives are" if len(ends) > 1 else f"{first.kind} {first.name!r} is"
    shown = f" (first: {first.kind} {first.name!r})" if len(ends) > 1 else ""
    return (f"{rank.file}: {rank.where(first)}: {count} taken in process group {taken!r}, not in {inferred!r}, the "
            f"only group the rank's process-group metadata lists: rank {traced[teller_index].rank}'s "
            f"{teller.kind} ({traced[teller_index].where(teller)}) between the same ranks names it{shown}")


def _inferred(op: TracedOp) -> str:
    """How an end's group was inferred, for a refusal: ' (only ...)' where the metadata gave it, '' where not."""
    return f" (only {op.group!r}, the one group its rank's process-group metadata lists)" if op.group_inferred else ""


def _settle_collectives(traced: list[TracedRank], ops: list[list[TracedOp]]) -> tuple[str, ...]:
    """Give collectives that name no group the one group of unnamed collectives where no trace names a group
    (in ``ops``, in place), with one warning; refuse the first of them beside named groups."""
    unnamed = [(index, position) for index, rank_ops in enumerate(ops) for position, op in enumerate(rank_ops)
               if op.kind == "collective" and not op.group]
    if not unnamed:
        return ()
    named = sorted({op.group for rank_ops in ops for op in rank_ops if op.group}
                   | {name for rank in traced for name in rank.groups})
    index, position = unnamed[0]
    rank, first = traced[index], ops[index][position]
    if named:
        shown = ", ".join(map(repr, named[:4])) + (", ..." if len(named) > 4 else "")
        raise trace_error(rank.file, rank.where(first), f"collective {first.name!r} names no process group, while "
                          f"the traces name {len(named)} ({shown}): which ranks run it is unknown", GROUP_ALLOWED)
    for index, position in unnamed:
        op = ops[index][position]
        if op.description != first.description:
            raise trace_error(traced[index].file, traced[index].where(op), f"collective {op.name!r} names no process "
                              f"group and describes it as {op.description!r}, but {first.name!r} "
                              f"({rank.file}: {rank.where(first)}) as {first.description!r}: which ranks run each is "
                              "unknown", GROUP_ALLOWED)
        ops[index][position] = replace(op, group=UNNAMED_GROUP)
    runners = sorted({traced[index].rank for index, _ in unnamed})
    return (f"{rank.file}: {rank.where(first)}: {len(unnamed)} collective{'s' if len(unnamed) > 1 else ''} name no "
            f"process group, and no trace names one: taken as one group of the ranks that run them "
            f"({', '.join(map(str, runners))})",)
