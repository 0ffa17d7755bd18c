"""Seed 000's decision tree for a parallel layout (section 21.9.1), as code, so the layout search can say where
and why the simulator's winner disagrees with it.

The tree: if one GPU can train the model, use DP (with ZeRO-1/2 to save memory). Otherwise, if the parameters
do not fit but one layer does, split layers with PP and use DP for the rest; if one layer does not fit, TP
(no larger than the NVLink domain) is a must; if activations (long sequences) are what does not fit, TP +
sequence parallelism + activation recompute. Where selective recompute saves no memory (flash attention stores
no attention scores for it to drop) the tree tries no recompute in its place, so it never pays the attention
forward again for nothing. Its three rules: TP <= GPUs of the NVLink domain (a DGX host, an NVL72 rack);
PP <= layers and m >= 4p so that the bubble is small (at pp 1 there is none, and any m will do); DP takes every
remaining GPU. Here every "does it fit" is the simulator's memory model, micro-batches are of 1 sequence,
without CP or interleaving, the tree's DP shards with ZeRO-1, and a MoE model keeps the scenario's expert
parallelism.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulator.sweep.layouts import Candidate, Checked, Pruned, powers_of_two
from simulator.sweep.options import Recompute, Sharding
from simulator.units import format_memory
from simulator.workload.stage_work import layers_per_stage

MICROBATCHES_PER_STAGE = 4
"""Rule 2: m >= 4p keeps the 1F1B bubble (p-1)/(m+p-1) under about 20%. It holds for p > 1 only: at pp 1
nothing is pipelined and the bubble is 0 whatever m (the tree ruled out pp 1 with m < 4, so found no layout for
the 70B 2k-GPU step, where TP8 PP1 DP256, m = 2, fits and runs fastest)."""

MEMORY_AND_BUBBLE = "every pp it checked is out of memory and the others give m < 4p (the bubble rule)"
"""Why a branch has no layout where memory ruled out some pp and the bubble rule the others: at one tp, m / p
is the same at every pp above 1, so it is pp 1 out of memory and every deeper pp below the rule."""


@dataclass(frozen=True)
class Fit:
    """The first layout of a branch that fits (None: none), whether the branch checked any layout's memory
    (False: the bubble rule or the splits ruled every one out first), whether the bubble rule ruled any out
    (False with nothing checked: no pp split the layers, GPUs and batch at all) and whether any checked layout
    was out of memory (False with some checked: the simulator's checks refused each). The flags are read only
    where no layout fits (`ruled_out`)."""

    candidate: Candidate | None
    checked_any: bool
    bubbled_any: bool
    over_memory: bool

    def ruled_out(self) -> str:
        """What ruled out every layout of a branch where none was out of memory: the simulator's checks where it
        checked some (each refused: a scenario the step cannot be built from), else the bubble rule where it
        ruled a pp out, else that no pp splits the layers, GPUs and batch at all."""
        if self.checked_any:
            return "is refused by the simulator's checks (not memory)"
        return ("gives no m >= 4p (the bubble rule, not memory)" if self.bubbled_any
                else "has no pp that splits the layers, GPUs and batch (not memory)")


@dataclass(frozen=True)
class TreeChoice:
    """The tree's layout (None when nothing it tries fits) and the steps it took, in words."""

    candidate: Candidate | None
    steps: tuple[str, ...]


def seed_tree_choice(world: int, domain_gpus: int, layers: int, global_batch: int, layer_fits: bool,
                     check: Callable[[Candidate], Checked], ep: int = 1, eager: bool = False,
                     selective_saves_memory: bool = True, fewer_on_ends: bool = False) -> TreeChoice:
    """Walk the tree; ``check`` is the memory check the search uses, ``layer_fits`` whether one layer's model
    state fits on a GPU (its routed experts split over ``ep``), ``ep`` the scenario's expert parallelism,
    ``selective_saves_memory`` whether selective recompute keeps less than no recompute (not under flash
    attention), ``fewer_on_ends`` the scenario's `first_last_fewer_layers` (pp then splits layers + 2). Under
    ``eager`` (training.kernels: eager, which runs plain DDP or FSDP's full_shard, pipelined or not, and no ZeRO
    or TP) the tree's DP shards with FSDP where plain DDP does not fit, as it shards with ZeRO-1 otherwise: for
    each recompute, lightest first, DDP over every GPU, then FSDP over every GPU, then PP + DDP, then PP + FSDP.
    TP goes up to ``domain_gpus``, the GPUs of one NVLink domain."""
    steps = []
    sharding: Sharding = "zero0" if eager else "zero1"
    single = check(Candidate(1, 1, 1, world, 1, 1, sharding, "none", ep))
    whole = f"plain DDP over all {world} GPUs" if eager else f"ZeRO-1 over all {world} GPUs"
    if not single.reason:
        held = ("every GPU holds the whole model" if ep == 1
                else f"every GPU holds the dense layers and 1/{ep} of the routed experts (EP {ep})")
        steps.append(f"{held} with {whole} ({format_memory(single.peak_memory_gib)}): DP over every GPU")
        return TreeChoice(single.candidate, tuple(steps))
    steps.append(f"{whole}: {single.reason}")  # the layout tried, as the eager branch names its FSDP one
    if eager:
        found = _eager_first_fit(world, layers, global_batch, check, steps, ep, selective_saves_memory,
                                 fewer_on_ends)
        if found is not None:
            return TreeChoice(found, tuple(steps))
        steps.append("nothing the tree tries fits in memory: eager kernels run plain DDP, FSDP and PP only (no "
                     "ZeRO or TP)")
        return TreeChoice(None, tuple(steps))
    if layer_fits:
        # pp 1 at tp 1 is the layout the first step checked (ZeRO-1 over every GPU): PP starts at 2, as eager's does
        fit = _first_fit([1], ["none"], world, layers, global_batch, check, steps, ep, fewer_on_ends, smallest_pp=2)
        if fit.candidate is not None:
            steps.append("the parameters did not fit but a layer does: PP across layers, DP for the rest")
            return TreeChoice(fit.candidate, tuple(steps))
        # at tp 1, m / p is the same at every pp from 2: the bubble rule rules out all of them or none
        alone = fit.ruled_out() if not fit.over_memory else "does not fit: activations are what overflows"
        steps.append(f"PP + DP alone {alone}, so TP + SP + recompute")
        recomputes = _recomputes(["selective", "full"], selective_saves_memory, steps)
    else:
        steps.append("one layer does not fit: TP is a must (no wider than the NVLink domain)")
        recomputes = _recomputes(["none", "selective", "full"], selective_saves_memory, steps)
    tps = [tp for tp in powers_of_two(domain_gpus) if tp > 1]
    fit = _first_fit(tps, recomputes, world, layers, global_batch, check, steps, ep, fewer_on_ends)
    if fit.candidate is not None:
        return TreeChoice(fit.candidate, tuple(steps))
    if not fit.over_memory:
        steps.append(f"nothing the tree tries fits: TP + SP {fit.ruled_out()}")
    else:
        steps.append(f"nothing the tree tries fits: {MEMORY_AND_BUBBLE}" if fit.bubbled_any
                     else "nothing the tree tries fits in memory")
    return TreeChoice(None, tuple(steps))


def _recomputes(tree_order: list[Recompute], selective_saves_memory: bool, steps: list[str]) -> list[Recompute]:
    """The recomputes a branch of the tree tries, lightest first: its own order where selective recompute saves
    memory; else no recompute in selective's place (the same memory, without the attention forward run again),
    saying so in ``steps``."""
    if selective_saves_memory:
        return tree_order
    steps.append("selective recompute saves no memory under flash attention (no scores stored): none, then full")
    return list(dict.fromkeys("none" if recompute == "selective" else recompute for recompute in tree_order))


def _eager_first_fit(world: int, layers: int, global_batch: int, check: Callable[[Candidate], Checked],
                     steps: list[str], ep: int, selective_saves_memory: bool,
                     fewer_on_ends: bool) -> Candidate | None:
    """Eager's first layout that fits, lighter recompute first (recompute costs more than sharding or a
    pipeline bubble): for each, plain DDP over every GPU, FSDP over every GPU, then PP + plain DDP, then
    PP + FSDP. Plain DDP without recompute is the tree's first check, not repeated here."""
    eager_shardings: dict[Sharding, str] = {"zero0": "plain DDP", "fsdp": "FSDP"}
    for recompute in _recomputes(["none", "selective", "full"], selective_saves_memory, steps):
        for sharding, name in eager_shardings.items():
            if (sharding, recompute) == ("zero0", "none"):
                continue
            whole = check(Candidate(1, 1, 1, world, 1, 1, sharding, recompute, ep))
            if not whole.reason:
                steps.append(f"every GPU holds {'its shard of ' if sharding == 'fsdp' else ''}the model with "
                             f"{name} over all {world} GPUs, recompute={recompute} "
                             f"({format_memory(whole.peak_memory_gib)}): DP over every GPU")
                return whole.candidate
            steps.append(f"{name} over all {world} GPUs" + (f" recompute={recompute}" if recompute != "none" else "")
                         + f": {whole.reason}")
        for sharding, name in eager_shardings.items():
            steps.append(f"PP + DP with {name}")
            found = _first_fit([1], [recompute], world, layers, global_batch, check, steps, ep, fewer_on_ends,
                               sharding, smallest_pp=2).candidate
            if found is not None:
                return found
    return None


def _first_fit(tps: list[int], recomputes: list[Recompute], world: int, layers: int, global_batch: int,
               check: Callable[[Candidate], Checked], steps: list[str], ep: int, fewer_on_ends: bool,
               sharding: Sharding = "zero1", smallest_pp: int = 1) -> Fit:
    """The first layout that fits: lighter recompute first, then smaller TP, then smaller PP from
    ``smallest_pp`` (with m >= 4p where pp > 1), each pp splitting the layers as the scenario's stages do; and
    whether any layout was checked at all (at tp 1 on 2,048 GPUs with global batch 512, no dp divides the batch at
    pp 1 and m < 4p at every deeper pp: the bubble rule rules each out before memory is weighed) and whether any
    checked layout was out of memory (`Fit.over_memory`)."""
    checked_any = bubbled_any = over_memory = False
    for recompute in recomputes:
        for tp in tps:
            tried: list[Checked] = []
            bubbled: list[tuple[int, int]] = []  # (pp, m) of the pp that split but give m < 4p
            for pp in range(smallest_pp, layers + 3):
                if not layers_per_stage(layers, pp, fewer_on_ends) or world % (tp * pp):
                    continue
                dp = world // (tp * pp)
                if global_batch % dp:
                    continue
                if pp > 1 and global_batch // dp < MICROBATCHES_PER_STAGE * pp:
                    bubbled.append((pp, global_batch // dp))
                    continue
                checked = check(Candidate(tp, 1, pp, dp, 1, 1, sharding, recompute, ep))
                checked_any = True
                over_memory = over_memory or (checked.pruning is not None
                                              and checked.pruning.kind == Pruned.OUT_OF_MEMORY)
                if not checked.reason:
                    steps.append(f"tp{tp} recompute={recompute}: pp{pp} fits ({format_memory(checked.peak_memory_gib)})"
                                 + (f" after {_tried_text(tried)}" if tried else ""))
                    return Fit(checked.candidate, True, bubbled_any or bool(bubbled), over_memory)
                tried.append(checked)
            bubbled_any = bubbled_any or bool(bubbled)
            steps.append(f"tp{tp} recompute={recompute}: " + _none_fits_text(tried, bubbled))
    return Fit(None, checked_any, bubbled_any, over_memory)


def _tried_text(tried: list[Checked]) -> str:
    """The pp checked and ruled out, each by its kind, the deepest (the nearest to fitting) with its reason in
    full: 'pp 1, 2, 4, 8 out of memory (pp8: 328.6 GiB > 79.6 GiB HBM)'; the tree named the last alone."""
    kinds: dict[str, list[int]] = {}
    for checked in tried:
        kinds.setdefault(_kind(checked), []).append(checked.candidate.pp)
    deepest = tried[-1]
    detail = deepest.reason.removeprefix(f"{_kind(deepest)}: ")
    return "; ".join(f"pp {', '.join(map(str, pps))} {kind}" for kind, pps in kinds.items()) + (
        f" (pp{deepest.candidate.pp}: {detail})")


def _kind(checked: Checked) -> str:
    """What ruled a checked layout out, in the words of its kind ('out of memory')."""
    return checked.pruning.kind.label if checked.pruning is not None else ""


def _none_fits_text(tried: list[Checked], bubbled: list[tuple[int, int]]) -> str:
    """Why no pp of a tp and recompute was taken: those checked, by what ruled them out (`_tried_text`), and
    those the bubble rule ruled out first, with their m: where none was checked it is the rule, not memory, and
    where the rule ruled none out either, no pp split the layers, GPUs and batch."""
    if not tried and not bubbled:
        return "no pp splits the layers, GPUs and batch"
    if all(m == pp for pp, m in bubbled):
        rule = f"m = p at pp {', '.join(str(pp) for pp, _ in bubbled)}"
    else:
        rule = ", ".join(f"pp{pp} m={m}" for pp, m in bubbled)
    if not tried:
        return f"no pp gives m >= 4p ({rule})"
    return "no pp with m >= 4p fits: " + _tried_text(tried) + (f"; m < 4p at {rule.removeprefix('m = p at ')}"
                                                              if bubbled else "")
