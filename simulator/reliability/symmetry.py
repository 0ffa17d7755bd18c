"""A job's states with links down that are rotations of each other by whole data-parallel replicas: one step.

A leaf switch down in one leaf group and the same rail's leaf down in another are, on most layouts, the same
step: the fabric maps onto itself by rotating its hosts by whole periods of its spine hash (topology/periods.py
`Rotation`), and the layout onto itself by rotating its data-parallel replicas by as many. The job then
simulates one state of each class (`StateSymmetry.representative`) and takes every member's step from it.

That is exact only where the rotation maps the whole step onto itself, which `state_symmetry` proves for the
job's healthy step, or says why not (the job then simulates every state, as before):

- the rotation maps the wiring onto itself, every link onto a link of the same bandwidth, latency and class
  (`Rotation.of`), so that the detours around the links down rotate with them (faults/rerouting.py picks
  them in the frame of the source's period);
- data parallelism is outermost over every GPU of the cluster, and some number of replicas spans whole periods
  (replicas.py `shift_step`): the rotation by them moves each rank onto the rank of the same pipeline stage and
  tensor/context lane in another replica, which runs the same program (the fold's premise: a replica's ranks
  do alike work);
- every collective's copies (its group and mirrors) map onto copies of the same collective, each planned as
  the moved plan of its preimage, phase by phase, transfer for transfer (a ring onto a rotation of itself, a
  tree or a hierarchical plan exactly), and each transfer's route onto the moved route, link by link;
- the scenario injects no step faults of its own (`faults.step`), which sit on fixed GPUs and links.

States merged are those with links down alone (no straggler, no spine or NVSwitch tray down, every replica
in use): a straggler's state folds and shares the job's fold (reliability/states.py), so it is cheap already,
and a GB200 rack's trays are named by rack, which the rotation is not proven to move.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as with_fields

import numpy as np

from simulator.collectives.phases import Phase
from simulator.engine.plans import PlanCache
from simulator.engine.replicas import shift_step
from simulator.engine.shapes import CollectiveShapes
from simulator.parallel.layout import Layout
from simulator.program.step import StepProgram
from simulator.topology.graph import Topology
from simulator.topology.periods import Rotation


@dataclass(frozen=True)
class StateSymmetry:
    """The rotations proven to map a job's step onto itself: by ``turns`` periods of ``rotation`` and its
    multiples (``order`` of them, the identity included)."""

    rotation: Rotation
    turns: int
    order: int
    replicas: int
    """The data-parallel replicas each rotation moves a rank by."""
    link_ends: Sequence[tuple[str, str]] = field(compare=False, repr=False)
    """The topology's links, sorted (`Topology.link_ends`): a link's index orders links as their node pairs do."""
    link_index: Mapping[tuple[str, str], int] = field(compare=False, repr=False)
    """Each link's index into ``link_ends``."""
    link_images: np.ndarray = field(compare=False, repr=False)
    """Row p: each link's image (its index) under the rotation by p * ``turns`` periods."""

    @staticmethod
    def of(topology: Topology, rotation: Rotation, turns: int, order: int, replicas: int) -> StateSymmetry:
        """The rotations by ``turns`` periods of ``rotation`` on ``topology``, with each link's images."""
        step = rotation.links(topology, turns).astype(np.int32)
        images = np.empty((order, len(step)), dtype=np.int32)
        images[0] = np.arange(len(step), dtype=np.int32)
        for power in range(1, order):
            images[power] = step[images[power - 1]]
        return StateSymmetry(rotation, turns, order, replicas, topology.link_ends, topology.link_index, images)

    def representative(self, links: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """The links ``links`` (node pairs of the topology's links, sorted) rotated to the least of their images:
        the same for every rotation of them. Worked out on link indices, which order links as their node pairs
        do: each image's indices sorted, the least row taken (a 16,384-GPU job's 19,663 states of up to 7
        leaves down each have 64 images)."""
        ids = np.fromiter(map(self.link_index.__getitem__, links), dtype=np.int64, count=len(links))
        images = np.sort(self.link_images[:, ids], axis=1)
        rows = np.arange(self.order)
        for column in images.T:  # the rows least in each column in turn: one or two columns settle it
            values = column[rows]
            rows = rows[values == values.min()]
            if len(rows) == 1:
                break
        return tuple(map(self.link_ends.__getitem__, images[rows[0]].tolist()))

    def describe(self) -> str:
        """The symmetry, in words."""
        return (f"rotations by {self.replicas} data-parallel replica(s) ({self.order} of them, "
                f"{self.turns * self.rotation.period:,} GPUs apart)")


def state_symmetry(topology: Topology, layout: Layout | None, own_faults: bool,
                   healthy: Callable[[], tuple[StepProgram, PlanCache]]) -> StateSymmetry | str:
    """The rotations that map the job's healthy step on ``topology`` onto itself, or why none is proven (module
    docstring). ``own_faults``: the scenario injects `faults.step`; ``healthy()``: the step's (folded) program
    and its plan cache, built only once the checks that need neither pass."""
    if layout is None:
        return "a replayed trace's ranks need not do alike work"
    if own_faults:
        return "the scenario's own faults.step sit on fixed GPUs and links"
    rotation = Rotation.of(topology)
    if rotation is None:
        return ("the cluster does not map onto itself by whole leaf groups (a partial last leaf group, or a fabric "
                "without a spine hash period)")
    step = shift_step(layout, rotation.period) if layout.world == topology.num_gpus else 0
    if not step or step == layout.dp:
        return ("no rotation by whole data-parallel replicas spans whole leaf groups (data parallelism not "
                "outermost over every GPU, or one period holds every replica)")
    turns = step * layout.stride("dp") // rotation.period
    symmetry = StateSymmetry.of(topology, rotation, turns, layout.dp // step, step)
    why = _collectives_rotate(*healthy(), symmetry)
    return symmetry if why is None else why


def _collectives_rotate(program: StepProgram, plans: PlanCache, symmetry: StateSymmetry) -> str | None:
    """None where every collective's copies map onto its copies, plan and routes moved with them, under the
    rotation by ``symmetry.turns`` periods (its powers follow); else the first that does not, in words."""
    rotation, turns = symmetry.rotation, symmetry.turns
    topology = plans.topology
    moved_link = symmetry.link_images[1].tolist()
    routes: set[tuple[int, int, int]] = set()
    shapes = CollectiveShapes.of(program.ops)
    for op in shapes.firsts:
        copies = {frozenset(copy): copy for copy in (op.group, *op.mirrors)}
        for copy in copies.values():
            image = copies.get(frozenset(rotation.gpu(gpu, turns) for gpu in copy))
            if image is None:
                return f"{op.op} of group {list(op.group)[:8]}: a rotated copy is no copy of it"
            if not _moved_plan(plans.phases(op, copy), plans.phases(op, image), rotation, turns):
                return f"{op.op} of group {list(op.group)[:8]}: a rotated copy is planned otherwise"
            routes.update((t.src, t.dst, t.channel) for phase in plans.phases(op, copy) for t in phase.transfers)
    path = topology.path
    for src, dst, channel in sorted(routes):
        image = path(rotation.gpu(src, turns), rotation.gpu(dst, turns), channel)
        if image != tuple(moved_link[link] for link in path(src, dst, channel)):
            return f"the route from GPU {src} to GPU {dst} does not rotate with its ends"
    return None


def _moved_plan(phases: tuple[Phase, ...] | list[Phase], images: tuple[Phase, ...] | list[Phase],
                rotation: Rotation, turns: int) -> bool:
    """Whether ``images`` is ``phases`` with every transfer's ends rotated, phase by phase (every other field of
    a phase equal, the transfers as a multiset)."""
    if len(phases) != len(images):
        return False
    for phase, image in zip(phases, images):
        if with_fields(phase, transfers=()) != with_fields(image, transfers=()):
            return False
        moved = sorted(t._replace(src=rotation.gpu(t.src, turns), dst=rotation.gpu(t.dst, turns))
                       for t in phase.transfers)
        if moved != sorted(image.transfers):
            return False
    return True
