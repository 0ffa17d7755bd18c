"""Layouts whose pipeline hand-offs stay inside NVLink domains alike in every replica, offered where a step too
large unfolded is refused because they do not (engine/symmetry.py `UnalignedHandOff`).

A hand-off over NVLink in one replica and over the NICs in another unfolds the step on either network model, so
only a layout or cluster that aligns the stages with the NVLink domains removes that blocker: another pp, another
tp, or a size of the NVLink domain (a GB200 rack's `trays`), each with the dp that keeps the GPUs and the
micro-batches that keep the global batch where the scenario gives them. Each candidate is built as `--set` builds
a scenario and kept only where the loader, the layout's checks (`scale.refuse_wrong_layout`), the batch check and
the alignment, read from its parameters (`topology/size.HostShape`), take it: the remedies offered run past that
blocker as pasted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from simulator.config.loader import LoadedScenario
from simulator.errors import InputError
from simulator.memory_remedies import kept_batch, rebuilt
from simulator.parallel.layout import Layout
from simulator.scenario_checks import refuse_inconsistent_batch

MAX_TRIED = 24
"""The most values of one knob tried: nearest to the scenario's first, each a few ms (a loader pass)."""


def aligned_stage_remedies(loaded: LoadedScenario) -> tuple[tuple[str, ...], ...]:
    """Per knob (pp, tp, then each of the cluster's size parameters), the `--set`s of the value nearest the
    scenario's whose layout hands every stage on alike in every replica (`_aligned`); none where the scenario
    cannot be rebuilt from its data or has no layout."""
    from simulator.scale import scenario_gpus
    from simulator.topology.size import SIZE_PARAMETERS

    if loaded.written is None or loaded.scenario.model is None:
        return ()
    layout = _layout(loaded)
    gpus = scenario_gpus(loaded)
    if layout is None or gpus is None:
        return ()
    knobs = [("parallelism.pp", layout.pp, False), ("parallelism.tp", layout.tp, False)]
    kind, params = _topology(loaded)
    knobs += [(f"cluster.{name}", params[name], True) for name in SIZE_PARAMETERS.get(kind, ())
              if isinstance(params.get(name), int)]
    found = []
    for field, value, size in knobs:
        for candidate in _nearest(value):
            built = _candidate(loaded, layout, gpus, field, candidate, size)
            if built is not None and _aligned(built.loaded, built.layout):
                found.append(built.settings)
                break
    return tuple(found)


def stage_remedies_text(remedies: tuple[tuple[str, ...], ...]) -> str:
    """The remedies for the refusal's allowed list: '--set parallelism.pp=3 --set parallelism.dp=12; ...'."""
    return "; ".join(" ".join(f"--set {setting}" for setting in settings) for settings in remedies)


def _aligned(candidate: LoadedScenario, layout: Layout) -> bool:
    """Whether every pipeline hand-off of ``layout``, ``candidate``'s (stage s to s + 1, the last to the first
    too), stays inside one NVLink domain in every replica and lane, or leaves it in every one (`hands_on_alike`);
    one domain where ``candidate``'s cluster is one host or its shape cannot be read."""
    from simulator.scale import scenario_hosts

    hosts = scenario_hosts(candidate)
    return hands_on_alike(layout, hosts.domain if hosts is not None else layout.world)


def hands_on_alike(layout: Layout, domain: int) -> bool:
    """Whether every rank of each pipeline stage of ``layout`` hands on to the next stage (the last to the first)
    inside its NVLink domain of ``domain`` consecutive GPUs, or every one outside it: each rank's receiver is the
    rank one stage on, ``stride('pp')`` apart, counted per stage over the ranks at once (walking every rank's
    coordinates took 1.3 s of CPU at 131,328 GPUs)."""
    if layout.pp == 1:
        return True
    ranks = np.arange(layout.world)
    stride = layout.stride("pp")
    stage = ranks // stride % layout.pp
    receivers = ranks + ((stage + 1) % layout.pp - stage) * stride
    inside = np.bincount(stage, weights=ranks // domain == receivers // domain, minlength=layout.pp)
    return bool(np.all((inside == 0) | (inside == layout.world // layout.pp)))


def _layout(loaded: LoadedScenario) -> Layout | None:
    """``loaded``'s layout on its cluster's GPUs, None where the checks refuse it or the cluster is unknown."""
    from simulator.scale import refuse_wrong_layout, scenario_gpus
    from simulator.workload.training import pipeline_depth, resolve_layout

    gpus = scenario_gpus(loaded)
    if gpus is None:
        return None
    try:
        refuse_wrong_layout(loaded.scenario, gpus)
        refuse_inconsistent_batch(loaded, gpus)
        return resolve_layout(loaded.scenario, gpus, pipeline_depth(loaded.scenario))
    except InputError:
        return None


def _topology(loaded: LoadedScenario) -> tuple[str, dict]:
    """The kind of ``loaded``'s topology and its parameters, defaults included (('', {}) where it cannot be
    read)."""
    from simulator.topology.loader import scenario_source_or_none

    source = scenario_source_or_none(loaded)
    return (source.kind, source.params) if source is not None else ("", {})


def _nearest(value: int) -> Iterator[int]:
    """Values from 1 up, other than ``value``, nearest it first (the smaller of two as near), `MAX_TRIED` at most."""
    tried = sorted((candidate for candidate in range(1, value + MAX_TRIED) if candidate != value),
                   key=lambda candidate: (abs(candidate - value), candidate))
    yield from tried[:MAX_TRIED]


@dataclass(frozen=True)
class _Candidate:
    """A remedy tried: its `--set`s, the scenario they build and its layout."""

    settings: tuple[str, ...]
    loaded: LoadedScenario
    layout: Layout


def _candidate(loaded: LoadedScenario, layout: Layout, gpus: int, field: str, value: int, size: bool
               ) -> _Candidate | None:
    """The `--set`s that write ``value`` to ``field`` with the dp that keeps the cluster's GPUs (``size``: a
    cluster size parameter, which changes them) where the scenario gives dp, and the micro-batches that keep the
    global batch where it gives the micro-batches (`memory_remedies.kept_batch`), built once; None where the
    loader or the layout's checks refuse them."""
    from simulator.scale import scenario_gpus

    try:
        changed = rebuilt(loaded, [f"{field}={value}"])
    except InputError:
        return None
    new_gpus = scenario_gpus(changed) if size else gpus
    if new_gpus is None:
        return None
    par = loaded.scenario.parallelism
    tp = value if field == "parallelism.tp" else layout.tp
    pp = value if field == "parallelism.pp" else layout.pp
    fixed = tp * layout.cp * pp
    if new_gpus % fixed:
        return None
    settings: tuple[str, ...] = (f"{field}={value}",)
    dp = new_gpus // fixed
    if par.dp is not None:
        settings += (f"parallelism.dp={dp}",)
    kept = kept_batch(loaded, layout.dp, dp, loaded.scenario.training.micro_batch)
    if not kept:
        return None
    settings += kept[0]
    try:
        candidate = changed if len(settings) == 1 else rebuilt(loaded, list(settings))
    except InputError:
        return None
    new_layout = _layout(candidate)
    return _Candidate(settings, candidate, new_layout) if new_layout is not None else None
