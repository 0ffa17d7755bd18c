"""The 4D layout: TP x CP x PP x DP ranks placed on GPUs in a given order, and the process groups.

Rank r's coordinates come from a mixed-radix split of r with the innermost dimension first, so with the
default order [tp, cp, pp, dp] the TP group of a rank is a block of consecutive GPUs (one node). Rank r runs
on GPU r.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

DIMENSIONS = ("tp", "cp", "pp", "dp")


def degrees_name(tp: int, cp: int, pp: int, dp: int, ep: int = 1) -> str:
    """Parallel degrees as every user-facing line spells them (the run's first line, a Gantt chart's title, a
    search's candidate labels): 'TP8 CP1 PP16 DP128', then 'EP8' where the experts are split (ep above 1)."""
    degrees = f"TP{tp} CP{cp} PP{pp} DP{dp}"
    return f"{degrees} EP{ep}" if ep > 1 else degrees


@dataclass(frozen=True)
class Layout:
    """Degrees per dimension and their order (innermost first)."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    order: tuple[str, ...] = DIMENSIONS

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def degree(self, dim: str) -> int:
        return getattr(self, dim)

    @cached_property
    def _strides(self) -> dict[str, int]:
        strides, stride = {}, 1
        for dim in self.order:
            strides[dim] = stride
            stride *= self.degree(dim)
        return strides

    def stride(self, dim: str) -> int:
        """Rank distance between neighbours along ``dim``."""
        return self._strides[dim]

    def coords(self, rank: int) -> dict[str, int]:
        """{'tp': i, 'cp': j, 'pp': k, 'dp': l} of ``rank``."""
        return {dim: (rank // self._strides[dim]) % self.degree(dim) for dim in self.order}

    def rank_of(self, **coords: int) -> int:
        """The rank at the given coordinates (missing ones are 0)."""
        return sum(coords.get(dim, 0) * self._strides[dim] for dim in self.order)

    @cached_property
    def _groups(self) -> dict[tuple[str | tuple[str, ...], int], tuple[int, ...]]:
        return {}

    def group(self, dim: str, rank: int) -> tuple[int, ...]:
        """The ranks that differ from ``rank`` only in ``dim``, in coordinate order. Each group is one tuple
        object however often it is asked for, so the engine and the plan cache recognise it by identity."""
        found = self._groups.get((dim, rank))
        if found is None:
            stride, degree = self._strides[dim], self.degree(dim)
            base = rank - (rank // stride) % degree * stride
            found = self._groups[(dim, rank)] = tuple(range(base, base + degree * stride, stride))
        return found

    def combined_group(self, dims: tuple[str, ...], rank: int) -> tuple[int, ...]:
        """The ranks that differ from ``rank`` only in the dimensions ``dims`` (e.g. dp x cp for gradients), in
        rank order; one tuple object per group, as `group`."""
        found = self._groups.get((dims, rank))
        if found is None:
            members = [rank]
            for dim in dims:
                members = [m for base in members for m in self.group(dim, base)]
            found = self._groups[(dims, rank)] = tuple(sorted(members))
        return found

    def stage_ranks(self, stage: int) -> list[int]:
        """Every rank of pipeline stage ``stage``, in rank order: the blocks of ``stride`` ranks that start at
        ``stage * stride`` in each run of ``pp * stride`` ranks."""
        stride, degree = self._strides["pp"], self.pp
        return [block + stage * stride + offset for block in range(0, self.world, stride * degree)
                for offset in range(stride)]
