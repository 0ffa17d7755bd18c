"""The names of the collective primitives, algorithms and protocols, each set defined once and importing nothing.

The schema checks a scenario against these at load and the op IR carries them; registry.py keys its
algorithms by `AlgorithmName` (a test holds the two equal). Kept apart from the registry so that reading a
scenario does not load the algorithms, the executor and the network model.
"""

from __future__ import annotations

from typing import Literal, TypeVar, get_args

Primitive = Literal["broadcast", "reduce", "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"]
PRIMITIVES: tuple[Primitive, ...] = get_args(Primitive)
POINT_TO_POINT: tuple[Primitive, ...] = ("send_recv", "all_to_all")
"""The ops only `direct` runs, point to point under Simple: a protocol asked of one (its own: a workload item's,
`trainsim collective --protocol`) other than simple is refused; the run-wide `collectives.protocol` is the other
collectives' and does not reach them."""

AlgorithmName = Literal["ring", "tree", "hierarchical", "direct", "halving_doubling", "nvls", "collnet_direct",
                        "nvls_sharp", "userbuffers", "ring_exchange"]
"""The registered algorithms (registry.py ALGORITHMS, in its order)."""
ALGORITHM_OPS: dict[AlgorithmName, tuple[Primitive, ...]] = {
    "ring": ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"),
    "tree": ("all_reduce", "broadcast", "reduce"),
    "hierarchical": ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"),
    "direct": ("all_to_all", "all_gather", "reduce_scatter", "all_reduce", "broadcast", "reduce", "send_recv"),
    "halving_doubling": ("all_reduce", "reduce_scatter", "all_gather"),
    "nvls": ("all_reduce", "reduce_scatter", "all_gather"),
    "collnet_direct": ("all_reduce",),
    "nvls_sharp": ("all_reduce",),
    "userbuffers": ("reduce_scatter", "all_gather"),
    "ring_exchange": ("all_gather",),
}
"""The primitives each algorithm implements (each module's ``OPS``): `trainsim collective --help` lists them
without loading the algorithms."""
AlgorithmChoice = Literal[AlgorithmName, "auto"]
"""What a collective may ask for: a registered algorithm, or `auto` (registry.py choose_algorithm)."""
ALGORITHM_CHOICES: tuple[AlgorithmChoice, ...] = get_args(AlgorithmChoice)

Protocol = Literal["simple", "ll128", "ll"]
"""NCCL's protocols (collectives/protocols.py), in the order `auto` breaks ties in."""
PROTOCOLS: tuple[Protocol, ...] = get_args(Protocol)
ProtocolChoice = Literal[Protocol, "auto"]
"""What a collective may ask for: a protocol, or `auto` (chosen with the algorithm, collectives/tuner.py)."""
PROTOCOL_CHOICES: tuple[ProtocolChoice, ...] = get_args(ProtocolChoice)

Choice = TypeVar("Choice", AlgorithmChoice, ProtocolChoice)


def run_choice(own: Choice | None, default: Choice) -> Choice:
    """What a collective runs with: its ``own`` algorithm or protocol, or where it leaves it unset or `auto` the
    run's ``default`` (`collectives:`), which may be `auto` itself (engine/plans.py's plan cache, scale.py)."""
    return own if own is not None and own != "auto" else default
