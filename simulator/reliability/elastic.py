"""The data-parallel sizes an elastic job restarts on, and the scenario of each.

An elastic job (`restart.elastic`) restarts on fewer data-parallel replicas when the spare pool cannot replace
every lost host, as torchelastic's min/max nodes or NeMo's fault-tolerant restarts on fewer nodes do. Each
replica keeps its hosts; `restart.elastic_batch` says what happens to the batch: `keep_per_replica`, each
replica keeps its micro-batches and the global batch shrinks with the replicas; `keep_global`, the global
batch stays and each replica runs more micro-batches (DP x micro-batches / size: gradient accumulation). It
runs only on the sizes its layout allows, from the layout's DP down to `restart.min_replicas` (1 unless given):
every size for a dense model, those whose DP x CP ranks EP divides for a mixture of experts (its expert groups
split the data-parallel ranks: EP 2 on DP 4 runs on 4 or 2 replicas, never 3), and with `keep_global` those
its global batch splits into whole micro-batches over (as Megatron-LM requires of DP, and DeepSpeed's
elasticity of its GPU counts: a batch of 4 micro-batches on DP 4 runs on 4, 2 or 1 replicas, never 3), and
only those whose step fits in GPU memory (ZeRO shards its states over fewer replicas, keep_global can hold
more micro-batches: a shrunk size that does not fit is skipped, as a trainer that ran out of memory there
would fail its restart). With too few hosts for the smallest it waits for repaired ones. Every size is checked
at load, before any step is simulated: its micro-batch count (keep_global), its cluster checked (its builder's
refusals, its GPUs the full cluster's first hosts: `_shrunk_gpus`) and its step resolved (layout, schedule,
sharding, experts: `build_training_step`, no op built) with its peak memory per GPU (the step summary's), so
a constraint that breaks as DP shrinks is one located line naming the size, not an error when the job first
shrinks, deep into a run, and so is an elastic job none of whose smaller sizes fits while its layout does. A
layout that does not fit itself gets a plain job's verdict, a warning (its step's out-of-memory line), not a
refusal: the job runs on it and the smaller sizes that fit, if any.

A shrunk job runs on the hosts of the replicas it keeps (`shrunk_cluster`): a fat tree of fewer `nodes` (with three
tiers the full one's fabric, only the hosts given up gone, `fabric_hosts`); on GB200
NVL72 racks, whose hosts are compute trays in a rack's NVLink domain, whole racks then a last rack of the trays
left (`last_rack_trays`), each tray in the domain it had (a replica inside a rack gives up trays, replicas
spanning racks whole racks). A size whose TP or EP groups span NVLink domains where each of the full job's stayed
inside one (a `parallelism.order` that puts DP inside them: their ranks move as DP shrinks) is refused at load,
naming the field, as its collectives would leave NVLink for the network every layer.

A replayed trace's job (`workload.trace`) shrinks by whole copies of its traced ranks: its sizes are the
multiples of the traced job's own data parallelism d up to `workload.dp` whose copies fill whole hosts
(`trace_sizes`, once the trace is read), each replica replaying its traced work (`keep_per_replica` only: the
trace's micro-batches are replayed as recorded, so `keep_global` is refused) and its ranks using the memory they
used, so no size is skipped for memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

import numpy as np

from simulator.config.loader import LoadedScenario
from simulator.config.locate import located
from simulator.config.reliability import ElasticBatch
from simulator.config.schema import MAX_MICROBATCHES, ClusterConfig, Scenario
from simulator.config.traces import TraceWorkload
from simulator.errors import InputError, ScenarioError
from simulator.memory_remedies import Peak, memory_remedies, peak_memory, remedies_text
from simulator.parallel.experts import expert_group_numbers
from simulator.parallel.layout import Layout
from simulator.reliability.inputs import files_key
from simulator.topology.builders import wired_hosts
from simulator.topology.graph import Topology
from simulator.topology.loader import (
    TopologySource,
    scenario_topology,
    scenario_topology_checked,
    scenario_topology_file,
)
from simulator.units import counted
from simulator.workload.memory_plan import GIB
from simulator.workload.training import microbatch_count, most_domains, pipeline_depth, resolve_layout, tp_domains


def shrunk_microbatches(batch: ElasticBatch, dp: int, microbatches: int, replicas: int) -> int:
    """Micro-batches per replica of a job of ``dp`` replicas running ``microbatches`` each, on ``replicas``:
    the same (keep_per_replica), or the global batch's share (keep_global; whole on every size the job runs
    on, allowed_sizes)."""
    if batch is ElasticBatch.KEEP_GLOBAL:
        return dp * microbatches // replicas
    return microbatches


def shrunk_cluster(cluster: ClusterConfig, topology: Topology, hosts: int) -> ClusterConfig:
    """``cluster`` (built as ``topology``) cut to its first ``hosts`` hosts, those of the replicas a shrunk job
    keeps (replica r on hosts r x hosts-per-replica on, DP being the layout's outermost dimension unless
    `parallelism.order` says otherwise): a fat tree's `nodes`; GB200 NVL72 racks' whole racks, then a last rack
    of the trays left (`racks`, `last_rack_trays`), so each kept tray stays in its rack's NVLink domain: a job
    whose replicas fit in a rack gives up trays of its last rack, one whose replicas span racks whole racks (a
    replica of 1.5 racks: a rack and a half). A three-tier fabric keeps its full wiring (`fabric_hosts`): each
    leaf group stays in its pod, every leaf, spine and core and their links stay as they were, only the hosts
    given up and their NICs' links go (a lone rack left has no network, with two tiers or three)."""
    overrides = cluster.overrides()
    if topology.params.get("kind") == "nvl72":
        trays = topology.params["trays"]
        racks = -(-hosts // trays)
        overrides.update(racks=racks, last_rack_trays=hosts - (racks - 1) * trays)
        networked = racks > 1
    else:
        overrides["nodes"] = hosts
        networked = True
    if networked and topology.params.get("tiers") == 3:
        overrides["fabric_hosts"] = wired_hosts(topology.num_hosts, topology.params)
    return ClusterConfig(topology=cluster.topology, **overrides)


def hosts_at(hosts: int, dp: int, replicas: int) -> int:
    """The hosts a job of ``dp`` replicas on ``hosts`` runs on at ``replicas`` of them: its first, as many as its
    replicas fill (also where a host holds several replicas or a replica spans a fraction of a host)."""
    return hosts * replicas // dp


def shrunk_scenario(scenario: Scenario, topology: Topology, dp: int, microbatches: int, replicas: int) -> Scenario:
    """``scenario`` (a layout of ``dp`` replicas on the cluster ``topology``, ``microbatches`` per replica) on
    ``replicas`` of its replicas: the hosts they fill (shrunk_cluster), DP set, each replica's micro-batches as
    `restart.elastic_batch` says (shrunk_microbatches); a replayed trace's `workload.dp` set to ``replicas``, its
    copies each replaying the trace as recorded."""
    cluster = shrunk_cluster(scenario.cluster, topology, hosts_at(topology.num_hosts, dp, replicas))
    if isinstance(scenario.workload, TraceWorkload):
        return scenario.model_copy(update={
            "cluster": cluster, "workload": scenario.workload.model_copy(update={"dp": replicas})})
    count = shrunk_microbatches(scenario.restart.elastic_batch, dp, microbatches, replicas)
    return scenario.model_copy(update={
        "cluster": cluster, "parallelism": scenario.parallelism.model_copy(update={"dp": replicas}),
        "training": scenario.training.model_copy(update={"microbatches": count, "global_batch": None})})


def shrunk_settings(scenario: Scenario, topology: Topology, dp: int, microbatches: int,
                    replicas: int) -> tuple[str, ...]:
    """The fields `shrunk_scenario` changes, as `--set`s of its values: what the shrunk job's memory remedies are
    weighed on (`memory_remedies` ``base_settings``; none of them touches these fields)."""
    shrunk = shrunk_scenario(scenario, topology, dp, microbatches, replicas)
    cluster = tuple(f"cluster.{name}={value}" for name, value in shrunk.cluster.overrides().items()
                    if scenario.cluster.overrides().get(name) != value)
    return (*cluster, f"parallelism.dp={shrunk.parallelism.dp}",
            f"training.microbatches={shrunk.training.microbatches}", "training.global_batch=null")


def allowed_sizes(dp: int, cp: int, ep: int, smallest: int, batch_microbatches: int | None = None) -> tuple[int, ...]:
    """Replica counts from ``smallest`` to ``dp``, ascending, whose DP x CP ranks EP divides and, when the
    global batch is kept (``batch_microbatches`` micro-batches in all), over which it splits whole."""
    return tuple(size for size in range(smallest, dp + 1)
                 if size * cp % ep == 0 and (batch_microbatches is None or batch_microbatches % size == 0))


@dataclass(frozen=True)
class ElasticSizes:
    """The replica counts a job runs on, ascending, the layout's DP last (only it when not elastic), and the
    smaller ones an elastic job skips because its step does not fit in GPU memory there: (size, peak memory
    per GPU in bytes), ascending, against the GPU's ``capacity_bytes``."""

    sizes: tuple[int, ...]
    out_of_memory: tuple[tuple[int, float], ...] = ()
    capacity_bytes: float = 0.0

    def out_of_memory_gib(self) -> dict[str, float]:
        """The sizes skipped for memory (as text, the summary's keys) -> the peak memory per GPU each needs, GiB."""
        return {str(size): peak / GIB for size, peak in self.out_of_memory}


T = TypeVar("T")
"""What a check of a shrunk job returns."""

_CHECKED: dict[str, ElasticSizes] = {}
"""Sizes already checked, by the scenario less the sections they do not depend on and the files it reads
(inputs.py: a topology file or schedule table relative to its folder): a study reruns the job
for every interval and failure rate, and checking costs a step resolved per size (about 20 ms at 16,384 GPUs)."""
_CHECKED_SIZE = 64
UNCHECKED_SECTIONS = {"faults": True, "checkpoint": True, "storage": True, "run": True, "description": True,
                      "costs": True}


def elastic_sizes(loaded: LoadedScenario, topology: Topology,
                  progress: Callable[[int, int], None] | None = None) -> ElasticSizes:
    """The replica counts the job runs on, ascending, the layout's DP last (only it for a job that is not
    elastic), and those skipped for memory; each smaller one checked (`_check_size`) once per process,
    ``progress(done, total)`` hearing of each (a 16,384-GPU job checks 127, for seconds). Refusals are
    located. The key holds which restart fields the scenario gives, as a job that is not elastic
    refuses an elastic policy given explicitly even at its default value."""
    scenario = loaded.scenario
    key = (scenario.model_dump_json(exclude=UNCHECKED_SECTIONS) + repr(sorted(scenario.restart.model_fields_set))
           + files_key(loaded))
    if key not in _CHECKED:
        if len(_CHECKED) >= _CHECKED_SIZE:
            del _CHECKED[next(iter(_CHECKED))]
        _CHECKED[key] = _checked_sizes(loaded, topology, progress=progress)
    return _CHECKED[key]


def check_sizes(loaded: LoadedScenario, topology: Topology) -> ElasticSizes:
    """`elastic_sizes` checked afresh, its refusal of a job none of whose smaller sizes fits without the
    remedies it weighs: what a memory remedy must pass (`memory_remedies`), which would otherwise weigh remedies
    of its own remedies."""
    return _checked_sizes(loaded, topology, weigh_remedies=False)


def trace_replicas(dp: int | None, traced_dp: int | None = None) -> int:
    """The data-parallel replicas a job of a replayed trace counts: `workload.dp` (``dp``), else the traced job's
    own data parallelism where its trace tells it (``traced_dp``, the summary's `trace.traced_dp`), else 1: dp
    absent and dp equal to the traced job's then count the same job alike. Before the trace is read (the sizes
    checked at load) only ``dp`` is known; the job's plan takes the count of its healthy step (simulate.py)."""
    return dp or traced_dp or 1


def _checked_sizes(loaded: LoadedScenario, topology: Topology, weigh_remedies: bool = True,
                   progress: Callable[[int, int], None] | None = None) -> ElasticSizes:
    """The job's sizes (elastic_sizes), refusing a `min_replicas` it cannot use, a size it cannot run on (its
    TP or EP groups leaving NVLink domains the full job's stayed in among them) and
    an elastic job that fits in GPU memory on none of its smaller sizes while its layout fits (one whose layout
    does not is warned about as a plain job is, by its step's summary), with the remedies of its largest such
    size where ``weigh_remedies``. A replayed trace's sizes turn on its traced job's data parallelism, known once
    its trace is read (`trace_sizes`): here only its batch policy and `min_replicas` against `workload.dp`, once
    it is elastic (an elastic setting beside a job that is not is refused first, offering `restart.elastic`).
    ``progress(done, total)`` hears of each smaller size checked."""
    scenario = loaded.scenario
    restart = scenario.restart
    workload = scenario.workload
    if isinstance(workload, TraceWorkload):
        dp = trace_replicas(workload.dp)
    else:
        layout = located(loaded, lambda: resolve_layout(scenario, topology.num_gpus, pipeline_depth(scenario)))
        dp = layout.dp
    if not restart.elastic:
        for name, what in (("min_replicas", "bounds an elastic job's shrinking"),
                           ("elastic_batch", "sets an elastic job's batch on fewer replicas"),
                           ("regrow", "says when an elastic job grows back")):
            if name in restart.model_fields_set:
                raise loaded.error(("restart", name), f"{name} {what}", f"restart.elastic: true, or no {name}")
        return ElasticSizes((dp,))
    if isinstance(workload, TraceWorkload):
        _refuse_global_batch_of_trace(loaded)
        if workload.dp is not None:
            _check_min_replicas(loaded, workload.dp, "workload.dp's")
        return ElasticSizes((dp,))
    if topology.num_hosts % layout.dp:
        raise loaded.error(("restart", "elastic"), "elastic needs whole hosts per data-parallel replica",
                           "a layout whose replicas each fill whole hosts")
    smallest = _check_min_replicas(loaded, layout.dp, "the layout's")
    microbatches = located(loaded, lambda: microbatch_count(scenario, layout.dp))
    kept = layout.dp * microbatches if restart.elastic_batch is ElasticBatch.KEEP_GLOBAL else None
    sizes = allowed_sizes(layout.dp, layout.cp, scenario.parallelism.ep, smallest, kept)
    _refuse_graph_shrinking(loaded, topology, sizes)
    fitting, out_of_memory, capacity = [layout.dp], [], 0.0
    spans = group_domains(layout, scenario.parallelism.ep, topology.gpu_domain_array)
    file = scenario_topology_file(loaded)
    smaller = sizes[-2::-1]
    for done, size in enumerate(smaller, 1):
        _check_batch(loaded, layout.dp, microbatches, size)
        peak, capacity = located(loaded, partial(_check_size, loaded, topology, file, layout.dp, microbatches,
                                                 size, spans))
        if peak > capacity:
            out_of_memory.append((size, peak))
        else:
            fitting.append(size)
        if progress is not None:
            progress(done, len(smaller))
    if len(fitting) == 1 and out_of_memory and _peak_memory(loaded, topology).bytes <= capacity:
        largest, peak = out_of_memory[0]
        shrink = shrunk_settings(loaded.scenario, topology, layout.dp, microbatches, largest)
        tried = f" ({remedies_text(memory_remedies(loaded, base_settings=shrink))})" if weigh_remedies else ""
        raise loaded.error(("restart", "elastic"), f"the elastic job fits in GPU memory on none of its "
                           f"smaller sizes: shrunk to {counted(largest, 'replica')} it needs {peak / GIB:.1f} GiB "
                           f"per GPU, the GPU holds {capacity / GIB:.1f} GiB", "less memory per GPU on fewer replicas"
                           f"{tried}, or restart.elastic: false")
    return ElasticSizes(tuple(reversed(fitting)), tuple(reversed(out_of_memory)), capacity if out_of_memory else 0.0)


def _refuse_graph_shrinking(loaded: LoadedScenario, topology: Topology, sizes: tuple[int, ...]) -> None:
    """Refuse, at `restart.elastic`, an elastic job on an explicit graph (`kind: graph`) that may shrink (``sizes``,
    ascending, holds a smaller one): a shrunk job's cluster is its topology rebuilt from fewer `nodes` or `racks`
    (`shrunk_cluster`), and a graph has neither. It was refused at `cluster.nodes`, 'expected a list, got 3'."""
    if len(sizes) > 1 and topology.params.get("kind") == "graph":
        raise loaded.error(("restart", "elastic"), f"the elastic job of {counted(sizes[-1], 'replica')} shrinks "
                           f"to as few as {sizes[0]:,} by rebuilding its topology on fewer hosts, and {topology.name} "
                           "is an explicit graph (kind: graph), which has no host count to rebuild it with",
                           "restart.elastic: false, or a topology built from parameters (kind: cluster or nvl72)")


def _check_min_replicas(loaded: LoadedScenario, dp: int, whose: str) -> int:
    """The smallest size an elastic job of ``dp`` replicas (``whose``: what sets them, as the refusal says it)
    may shrink to, `restart.min_replicas` or 1, refused above ``dp``."""
    smallest = loaded.scenario.restart.min_replicas or 1
    if smallest > dp:
        raise loaded.error(("restart", "min_replicas"), f"min_replicas {smallest} is above {whose} "
                           f"{counted(dp, 'replica')}", f"1 to {dp}")
    return smallest


def _refuse_global_batch_of_trace(loaded: LoadedScenario) -> None:
    """Refuse `restart.elastic_batch: keep_global` beside a replayed trace: each replica replays the traced step,
    whose micro-batches are the trace's own kernels, so a replica cannot take more of them on fewer replicas."""
    if loaded.scenario.restart.elastic_batch is ElasticBatch.KEEP_GLOBAL:
        raise loaded.error(("restart", "elastic_batch"), "a replayed trace's replicas each replay the traced step "
                           "as recorded, and it holds no more micro-batches to keep the global batch on fewer "
                           "replicas", "keep_per_replica beside workload.trace")


def trace_sizes(loaded: LoadedScenario, topology: Topology, replicas: int, traced_dp: int | None) -> ElasticSizes:
    """The replica counts a replayed trace's job of ``replicas`` replicas on ``topology`` runs on, once its
    trace is read: ``replicas`` alone unless elastic; else, from `restart.min_replicas` up, the multiples of the
    traced job's own data parallelism ``traced_dp`` (the summary's `trace.traced_dp`: `workload.dp` copies the
    traced ranks, so a size is a whole number of copies) whose copies fill whole hosts. None of them is skipped
    for memory: each rank replays its traced work, in the memory it used."""
    if not loaded.scenario.restart.elastic:
        return ElasticSizes((replicas,))
    given = isinstance(loaded.scenario.workload, TraceWorkload) and loaded.scenario.workload.dp is not None
    smallest = _check_min_replicas(loaded, replicas, "workload.dp's" if given else "the trace's job's")
    hosts = topology.num_hosts
    sizes = tuple(size for size in _whole_copies(hosts, replicas, traced_dp) if size >= smallest)
    _refuse_graph_shrinking(loaded, topology, sizes)
    file = scenario_topology_file(loaded)
    for size in sizes[:-1]:
        shrunk = replace(loaded, scenario=shrunk_scenario(loaded.scenario, topology, replicas, 1, size))
        _shrunk_check(hosts, replicas, size, partial(_shrunk_gpus, shrunk, topology, file,
                                                     hosts_at(hosts, replicas, size)))
    return ElasticSizes(sizes)


def one_size_warning(loaded: LoadedScenario, hosts: int, replicas: int, traced_dp: int | None) -> str | None:
    """A warning, located at `restart.elastic`, where an elastic trace job of ``replicas`` replicas on ``hosts``
    hosts has no smaller whole copy of the traced job's ``traced_dp`` replicas that fills whole hosts (`dp` left
    out or equal to it, or copies that split a host), whatever its `min_replicas`: elastic changes nothing and the
    job restarts as one that is not elastic. Before, such a job took `restart.elastic` without a word."""
    if not loaded.scenario.restart.elastic or _whole_copies(hosts, replicas, traced_dp) != (replicas,):
        return None
    allowed = "restart.elastic: false"
    if traced_dp == replicas:
        allowed = f"a workload.dp of several copies of the traced job's {counted(replicas, 'replica')}, or {allowed}"
    elif traced_dp:
        allowed = f"more hosts and a workload.dp that fills them, or {allowed}"
    return str(loaded.error(("restart", "elastic"), f"the trace's job runs on its {counted(replicas, 'replica')} "
                            "only: it shrinks by whole copies of the traced ranks that fill whole hosts, and has no "
                            "smaller one, so elastic changes nothing", allowed))


def _whole_copies(hosts: int, replicas: int, traced_dp: int | None) -> tuple[int, ...]:
    """The sizes of a replayed trace's job of ``replicas`` replicas on ``hosts`` hosts, ascending: the multiples of
    the traced job's ``traced_dp`` replicas (all of them, without it) whose copies fill whole hosts."""
    copy = traced_dp or replicas
    return tuple(size for size in range(copy, replicas + 1, copy) if hosts * size % replicas == 0)


def _check_batch(loaded: LoadedScenario, dp: int, microbatches: int, size: int) -> None:
    """Refuse a `keep_global` job whose global batch splits into more than MAX_MICROBATCHES micro-batches per
    replica on ``size`` replicas, naming the size."""
    training = loaded.scenario.training
    if loaded.scenario.restart.elastic_batch is not ElasticBatch.KEEP_GLOBAL:
        return
    total = dp * microbatches
    if total // size > MAX_MICROBATCHES:
        raise loaded.error(("restart", "elastic_batch"), f"the elastic job shrunk to {counted(size, 'replica')} "
                           f"keeps its global batch of {total * training.micro_batch} sequences: {total // size} "
                           f"micro-batches per replica", f"at most {MAX_MICROBATCHES}; elastic_batch: "
                           f"keep_per_replica, or restart.min_replicas above {size}")


def _check_size(loaded: LoadedScenario, topology: Topology, file: TopologySource, dp: int, microbatches: int,
                size: int, spans: dict[str, int]) -> tuple[float, float]:
    """Check the cluster of the job shrunk to ``size`` replicas (`_shrunk_gpus`; ``file``: its topology file,
    read) and resolve its step: its peak memory per GPU and the GPU's, as the step summary gives them, refusing
    TP or EP groups that leave the NVLink domain each of the full job's (``spans``: group_domains) stayed in; an
    error names the size and the `min_replicas` that avoids it."""
    shrunk = replace(loaded, scenario=shrunk_scenario(loaded.scenario, topology, dp, microbatches, size))

    def check() -> tuple[float, float]:
        cluster = _shrunk_gpus(shrunk, topology, file, topology.num_hosts * size // dp)
        peak = _peak_memory(shrunk, cluster)
        assert peak.layout is not None, "an elastic job has a layout (no parameter servers)"
        _refuse_split_groups(spans, group_domains(peak.layout, shrunk.scenario.parallelism.ep,
                                                  cluster.gpu_domain_array))
        return peak.bytes, peak.capacity

    return _shrunk_check(topology.num_hosts, dp, size, check)


def _shrunk_gpus(shrunk: LoadedScenario, full: Topology, file: TopologySource, hosts: int) -> Topology:
    """The GPUs of ``shrunk``, a job on ``full`` (built from ``file``) shrunk to its first ``hosts`` hosts
    (shrunk_cluster), with their NVLink domains: its cluster refused as building it would, then ``full``'s first
    hosts (`Topology.first_hosts`: the GPUs and domains of the cluster built, without its network; building the
    127 smaller sizes of a 16,384-GPU job took 20 s), or built where only building tells
    (`scenario_topology_checked`)."""
    return full.first_hosts(hosts) if scenario_topology_checked(shrunk, file) else scenario_topology(shrunk)


def group_domains(layout: Layout, ep: int, domains: np.ndarray) -> dict[str, int]:
    """The most NVLink domains one TP group and one EP group of ``layout`` span (1: each stays inside one), by
    the field that sets them, rank r on GPU r of NVLink domain ``domains[r]``. An EP group is a block of ``ep``
    ranks of a DP x CP group in rank order (parallel/experts.ep_group); ``ep`` divides its ranks."""
    ep_group = expert_group_numbers(layout, ep)[0]
    return {"tp": tp_domains(layout, domains), "ep": most_domains(ep_group, domains[:layout.world])}


def _refuse_split_groups(full: dict[str, int], shrunk: dict[str, int]) -> None:
    """Refuse TP or EP groups of a shrunk job that span NVLink domains where each of the full job's stayed in
    one: its per-layer collectives would leave NVLink for the network (on GB200 NVL72 racks, a TP group across
    two racks where the full job kept each in one; on every cluster kind, a DGX host being its own domain)."""
    for name, spans in shrunk.items():
        if full[name] == 1 and spans > 1:
            article = "an" if name == "ep" else "a"
            raise ScenarioError(f"{article} {name.upper()} group spans {spans} NVLink domains, where each of the "
                                "full job's stays inside one", field=f"parallelism.{name}",
                                allowed=f"a parallelism.order that keeps each {name.upper()} group inside one NVLink "
                                        "domain on fewer replicas")


def _shrunk_check(hosts: int, dp: int, size: int, check: Callable[[], T]) -> T:
    """``check`` of the job of ``dp`` replicas on ``hosts`` hosts shrunk to ``size``; its error names the size and
    the `min_replicas` that avoids it."""
    try:
        return check()
    except InputError as error:
        allowed = f"{error.allowed}; or " if error.allowed else ""
        raise error.rebuilt(problem=f"the elastic job shrunk to {counted(size, 'replica')} "
                                    f"({counted(hosts * size // dp, 'host')}): {error.problem}",
                            allowed=f"{allowed}restart.min_replicas above {size}") from None


def _peak_memory(loaded: LoadedScenario, topology: Topology) -> Peak:
    """The scenario's step resolved on ``topology`` (no op built): its peak memory per GPU, as the step summary
    gives it, and the GPU's, in bytes, with its layout. A parameter-server scenario never gets here: it has no job
    simulation (the schema refuses `run.horizon` with parameter servers)."""
    return located(loaded, lambda: peak_memory(loaded, topology))
