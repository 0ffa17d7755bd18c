"""Lane folding: one rank per context-parallel lane of each pipeline stage, the TP rails and DP replicas folded.

A stage-folded run times one rank per stage, so a pipeline hand-off ends when the slowest of its lanes' flows
does. Where the lanes' hand-offs cross the spines on uplinks of unlike load (the published long-context row),
each lane goes on at its own end, its compute slowed by its own hand-off's SMs for as long as that lane's flows
run, until a collective gathers the lanes: no one rank plays every lane then. Simulating each CP lane (rail 0,
replica 0) and folding only the rails and replicas, whose hand-offs hash alike and are exact images, times every
lane under its own hand-offs and SM holds; the run's lockstep check (engine/lockstep.py) certifies it as the
unfolded run as it does a stage-folded one.
"""

from __future__ import annotations

import numpy as np

from simulator.parallel.folding import mirror_images
from simulator.parallel.layout import Layout


def lane_representatives(layout: Layout) -> list[int]:
    """The ranks that get a program: rail 0 of replica 0 in every CP lane of every pipeline stage."""
    return [layout.rank_of(pp=stage, cp=lane) for stage in range(layout.pp) for lane in range(layout.cp)]


def lane_images(layout: Layout, group: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The copies of ``group`` that no simulated lane runs itself: its mirror images (`mirror_images`) that
    cover the same CP lanes, those of other TP rails and DP replicas. An image over other lanes is another lane's
    own group, which that lane's representative runs."""
    def lanes(members: tuple[int, ...]) -> list[int]:
        return sorted(((np.array(members) // layout.stride("cp")) % layout.cp).tolist())

    own = lanes(group)
    return tuple(image for image in mirror_images(layout, group) if lanes(image) == own)
