"""An all-to-all's bytes per (sender, receiver) pair, from what its members' traces tell.

Each traced member tells its row (the bytes it sends each member: Kineto's `In split size`) and its column (the
bytes it receives from each: `Out split size`); a member whose trace lists no splits sends and receives its
message in equal shares, as PyTorch splits an all-to-all without them. A pair that two traces tell (the
sender's row and the receiver's column) must agree. A pair between two members without a trace takes the mean
of the pairs the traces tell: its shares are nowhere recorded.
"""

from __future__ import annotations

from typing import NamedTuple

from simulator.workload.traces.model import trace_error

AGREEMENT = 1e-9
"""Relative difference below which a sender's and a receiver's bytes for one pair agree (float rounding of
split x row size)."""


class TracedShares(NamedTuple):
    """One member's part of an all-to-all as its trace has it: its rank, where (file and event), its message
    bytes, and the bytes it sends each member and receives from each in group order (() where not listed)."""

    rank: int
    file: str
    where: str
    nbytes: float
    sends: tuple[float, ...]
    receives: tuple[float, ...]


def pair_bytes(group: tuple[int, ...], told: list[TracedShares], label: str) -> tuple[tuple[float, ...], ...]:
    """The bytes member i sends member j of ``group`` (row i, column j, group order), from the traced members'
    ``told`` shares; () where no trace lists splits (an even all-to-all, each member's message split equally).
    A pair whose sender and receiver disagree (without splits: members of different message sizes), or shares
    listed for another number of members than the group has, is refused at the trace that tells the second
    figure."""
    size = len(group)
    place = {rank: index for index, rank in enumerate(group)}
    cells: dict[tuple[int, int], tuple[float, TracedShares]] = {}
    for shares in told:
        row, column = (listed or (shares.nbytes / size,) * size for listed in (shares.sends, shares.receives))
        if len(row) != size or len(column) != size:
            raise trace_error(shares.file, shares.where, f"{label} lists split sizes for "
                              f"{max(len(row), len(column))} members, but its group has {size}",
                              "one split size per member of the group")
        me = place[shares.rank]
        for other in range(size):
            _tell(cells, (me, other), row[other], shares, label, group)
            _tell(cells, (other, me), column[other], shares, label, group)
    if not any(shares.sends or shares.receives for shares in told):
        return ()
    told_off_diagonal = [value for (src, dst), (value, _) in cells.items() if src != dst]
    untold = sum(told_off_diagonal) / len(told_off_diagonal) if told_off_diagonal else 0.0
    return tuple(tuple(cells[src, dst][0] if (src, dst) in cells else untold for dst in range(size))
                 for src in range(size))


def _tell(cells: dict[tuple[int, int], tuple[float, TracedShares]], pair: tuple[int, int], value: float,
          teller: TracedShares, label: str, group: tuple[int, ...]) -> None:
    """Record that ``teller``'s trace gives ``pair`` (sender, receiver places) ``value`` bytes, refusing a
    figure that another trace gave otherwise: by their split sizes, or, where neither trace lists any (Chakra's
    never do), as members whose even all-to-alls differ in size."""
    known = cells.setdefault(pair, (value, teller))
    if abs(known[0] - value) <= AGREEMENT * max(known[0], value):
        return
    first = known[1]
    if not (teller.sends or teller.receives or first.sends or first.receives):
        raise trace_error(teller.file, teller.where, f"{label}: {teller.nbytes:.0f} bytes on rank {teller.rank}, but "
                          f"{first.nbytes:.0f} bytes on rank {first.rank} ({first.file}: {first.where})",
                          "the same primitive and size on every member")
    src, dst = (group[place] for place in pair)
    raise trace_error(teller.file, teller.where, f"{label}: rank {src} sends rank {dst} {value:.0f} bytes by rank "
                      f"{teller.rank}'s split sizes, but {known[0]:.0f} bytes by rank {first.rank}'s ({first.file}: "
                      f"{first.where})", "In split size and Out split size on which each sender and receiver "
                      "agree")
