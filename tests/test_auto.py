"""`auto` picks among the algorithms NCCL's tuner weighs, by estimates that agree with what the simulation of
those algorithms gives (collectives/tuner.py; docs/collectives.md, "The `auto` rule")."""

from __future__ import annotations

from dataclasses import replace

import pytest
from shared import GIB, KIB, MIB, NCCL_SIMPLE_BASE_S

from simulator.collectives import protocols, tuner
from simulator.collectives.chunking import AUTO_CHUNK
from simulator.collectives.execute import time_collective
from simulator.collectives.names import PROTOCOLS
from simulator.collectives.phases import CollectiveRequest
from simulator.collectives.ring import group_by_host
from simulator.collectives.tuner import (
    CHOICES,
    SLOPE_BYTES,
    SLOPES,
    Choice,
    candidates,
    choice_key,
    choose,
    estimates,
    first_period_translate,
    group_shape,
    group_terms,
    ll128_bus_caps,
    ll_bus_cap,
    nccl_capped,
    nccl_channels,
    terms_estimates,
    tree_passes,
    weighed_group,
)
from simulator.network.calibration import calibrated
from simulator.program.ops import CollectiveOp
from simulator.simulation import NetworkSettings, plan_cache
from simulator.topology.builders import build_topology
from simulator.topology.loader import load_topology

CHUNK = 4 * MIB
SIZES = [KIB * 4**k for k in range(12)] + [512 * MIB]
"""1 KiB .. 4 GiB in steps of 4, and 512 MiB: on two DGX A100s its tree has 8 chunks per pipeline, as many as GPUs
per host, where an estimate spreading the chains' NVLink bytes evenly over the steps came out 10% over the
simulated 5.16 ms and auto took the ring (5.50 ms)."""
MARGIN = 1.01
"""auto's pick may be this much slower in simulation than the fastest candidate NCCL would weigh."""
EXACT_ESTIMATES = ("ring", "nvls", "tree")
"""Estimated exactly (rel 1e-9) on the bundled DGX clusters, as the plans run them: the ring's step is n / (p ch)
per transfer over the most loaded link of its own routes (`tuner.PhaseLoad`), NVLS moves its `link_bytes` per switch
link, its tree across hosts is bound by its slower side, and the double tree runs stretch by stretch over its
busiest NVLink port and its most loaded link across hosts (`tuner.AcrossLinks`). Before the estimates read the
plans' own links, the ring across DGX H100s came out up to 1.6% over (one NVLink bound where the 8 rails bound the
simulation) and the LL tree over 16 DGX A100s at 1 MiB 0.972 of its simulation."""


def assert_estimate_holds(estimate: float, simulated_s: float, algorithm: str, context: object = None) -> None:
    """``estimate`` is ``simulated_s`` exactly for `EXACT_ESTIMATES`."""
    assert algorithm in EXACT_ESTIMATES, (algorithm, context)
    assert estimate == pytest.approx(simulated_s, rel=1e-9), (algorithm, context)


def simulated(topology, request: CollectiveRequest, algorithm: str, efficiency=None, protocol="simple") -> float:
    """The simulated time of ``request`` run by ``algorithm`` under ``protocol``, at the calibrated efficiencies
    unless given."""
    return time_collective(topology, request.op, algorithm, list(request.ranks), request.nbytes,
                           efficiency=calibrated(topology.gpu_model) if efficiency is None else efficiency,
                           chunk_bytes=request.chunk_bytes, protocol=protocol)


def tree_line(request: CollectiveRequest, topology, efficiency, protocol: str, cap: float) -> float:
    """The tree all-reduce weighed on one line at busbw ``cap`` (bytes/s): its own estimate's latency (the
    estimate less its slope's share, the slope read here from the estimate at `tuner.SLOPE_BYTES` and twice that)
    plus twice the size at the cap. Written out apart from `nccl_capped` on purpose, the cap given by hand: calling
    the tuner's own weighing would compare it with itself, where this fails if NCCL's caps, tuning.cc's ratio of
    0.5 or the slope the tuner keeps (`tuner.SLOPES`) go wrong."""
    terms = group_terms(request, topology, efficiency, ("tree",))

    def own(nbytes: float) -> float:
        return tuner._estimate(replace(request, nbytes=nbytes), terms, "tree", protocol, None)

    slope = (own(2 * tuner.SLOPE_BYTES) - own(tuner.SLOPE_BYTES)) / tuner.SLOPE_BYTES
    return own(request.nbytes) + request.nbytes * (2 / cap - slope)


def simulated_pairs(topology, request: CollectiveRequest, efficiency=None) -> dict[Choice, float]:
    """The simulated time of every (algorithm, protocol) NCCL's tuner weighs for ``request`` (`raw_pairs`), each
    no faster than NCCL's caps on its busbw let the tuner rate it (`nccl_capped`), as `auto` weighs them."""
    terms = group_terms(request, topology, calibrated(topology.gpu_model) if efficiency is None else efficiency)
    return {pair: nccl_rated(request, terms, pair, seconds)
            for pair, seconds in raw_pairs(topology, request, efficiency).items()}


def raw_pairs(topology, request: CollectiveRequest, efficiency=None) -> dict[Choice, float]:
    """The simulated time of every (algorithm, protocol) NCCL's tuner weighs for ``request``, as it runs."""
    names = candidates(request, topology, group_by_host(request.ranks, topology))
    return {Choice(name, protocol): simulated(topology, request, name, efficiency, protocol) for name in names
            for protocol in protocols.available(name, request.op, request.ranks, topology)}


def nccl_rated(request: CollectiveRequest, terms, pair: Choice, seconds: float) -> float:
    """``seconds`` of ``pair`` as `auto` weighs them: an LL or LL128 ring's or tree's no faster than NCCL's caps."""
    return nccl_capped(request, terms, pair.algorithm, pair.protocol, seconds)


@pytest.mark.parametrize("name", ["dgx-h100-cluster", "dgx-a100-cluster"])
@pytest.mark.parametrize("hosts", [1, 2, 4, 16])
def test_auto_is_the_fastest_nccl_candidate_and_its_estimate_holds(name, hosts, monkeypatch):
    """Over every GPU of 1 to 16 DGX H100s or DGX A100s, 1 KiB to 4 GiB: `hierarchical` (not an NCCL algorithm) is
    no candidate; every NCCL algorithm is weighed under each protocol it runs with (LL and LL128 for the ring and
    the tree's all-reduce), and the pick's simulated time, rated no faster than NCCL's caps as `auto` weighs it,
    is within `MARGIN` of the fastest candidate's so rated; the pick's estimate without the caps is its
    simulated time as it runs (the caps weigh the choice only)."""
    topology = load_topology(name, {"nodes": hosts})
    efficiency = calibrated(topology.gpu_model)
    ops = ["all_reduce", "reduce_scatter", "all_gather"] if hosts == 1 else ["all_reduce"]
    for op in ops:
        for nbytes in SIZES:
            request = CollectiveRequest(op, tuple(range(topology.num_gpus)), nbytes, chunk_bytes=CHUNK)
            assert "hierarchical" not in candidates(request, topology, group_by_host(request.ranks, topology))
            raw = raw_pairs(topology, request)
            terms = group_terms(request, topology, efficiency)
            times = {pair: nccl_rated(request, terms, pair, seconds) for pair, seconds in raw.items()}
            pick = choose(request, topology, efficiency)
            assert times[pick] <= MARGIN * min(times.values()), (op, nbytes, pick, times)
            with monkeypatch.context() as uncapped:
                uncapped.setattr(tuner, "nccl_capped", lambda request, terms, name, protocol, seconds: seconds)
                estimate = estimates(request, topology, efficiency, pick.protocol)[pick.algorithm]
            assert_estimate_holds(estimate, raw[pick], pick.algorithm, (op, nbytes, pick))


def test_tree_across_hosts_is_the_pick_for_small_messages_where_nccl_takes_it():
    """Between DGX A100s (no NVLink SHARP) the tree's few latency steps win small all-reduces and the ring's
    bandwidth the large ones, as in NCCL's tuner."""
    topology = load_topology("dgx-a100-cluster", {"nodes": 16})
    everyone = tuple(range(topology.num_gpus))
    for nbytes, algorithm in ((MIB, "tree"), (GIB, "ring")):
        request = CollectiveRequest("all_reduce", everyone, nbytes, chunk_bytes=CHUNK)
        assert choose(request, topology, protocol="simple").algorithm == algorithm


def test_one_gpu_per_host_weighs_the_flat_double_tree():
    """One GPU per host: the ring's steps and the tree's edges each cross one NIC, none shares a port, so both
    estimates are the simulated times exactly."""
    topology = load_topology("dgx-a100-cluster", {"nodes": 16})
    rail = tuple(range(0, topology.num_gpus, 8))
    for nbytes in (KIB, MIB, GIB):
        request = CollectiveRequest("all_reduce", rail, nbytes, chunk_bytes=CHUNK)
        times = {algorithm: simulated(topology, request, algorithm) for algorithm in ("ring", "tree")}
        efficiency = calibrated(topology.gpu_model)
        pick = choose(request, topology, efficiency, protocol="simple").algorithm
        assert times[pick] <= MARGIN * min(times.values()), (nbytes, times)
        for algorithm, estimate in estimates(request, topology, efficiency).items():
            assert estimate == pytest.approx(times[algorithm], rel=1e-9), (nbytes, algorithm)


def test_nvls_tree_across_h100_hosts():
    """NCCL runs its NVLS tree across hosts whose switches reduce (without SHARP); auto did not weigh it."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 4})
    request = CollectiveRequest("all_reduce", tuple(range(32)), 16 * MIB, chunk_bytes=CHUNK)
    assert choose(request, topology, protocol="simple").algorithm == "nvls"


@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
def test_nvls_inside_an_nvlink_domain_of_many_hosts(op):
    """A GB200 NVL72 rack is one NVLink domain over 18 hosts (trays): NVLS there was estimated as the NVLS tree
    across hosts (25 us + 2 x 5 x 20.9 us at 4 KiB, 9.4 times its simulated 25 us)."""
    topology = load_topology("gb200-nvl72", {})
    for nbytes in (4 * KIB, 16 * MIB, GIB):
        request = CollectiveRequest(op, tuple(range(topology.num_gpus)), nbytes, chunk_bytes=CHUNK)
        times = {algorithm: simulated(topology, request, algorithm) for algorithm in ("ring", "nvls")}
        efficiency = calibrated(topology.gpu_model)
        pick = choose(request, topology, efficiency, protocol="simple").algorithm
        assert times[pick] <= MARGIN * min(times.values()), (nbytes, times)
        assert_estimate_holds(estimates(request, topology, efficiency)["nvls"], times["nvls"], "nvls", nbytes)
    assert choose(CollectiveRequest(op, tuple(range(72)), 4 * KIB), topology, protocol="simple").algorithm == "nvls"


@pytest.mark.parametrize("op", ["broadcast", "reduce"])
@pytest.mark.parametrize("racks, trays", [(2, 4), (4, 2)])
def test_auto_weighs_the_ring_chain_over_gb200_racks_on_its_own_links(racks, trays, op):
    """GB200 racks (32 GPUs): the ring's broadcast and reduce are weighed on the chains' own routes
    (`ring.chain_step`), the NICs between racks, not the hop between the first two trays (NVLink inside rack 0),
    which would weigh Simple far too fast and pick it over a faster LL128: auto's pick simulates within MARGIN
    of the fastest pair's time."""
    topology = load_topology("gb200-nvl72", {"racks": racks, "trays": trays})
    efficiency = calibrated(topology.gpu_model)
    for nbytes in (MIB, 256 * MIB, GIB):
        request = CollectiveRequest(op, tuple(range(topology.num_gpus)), nbytes, chunk_bytes=AUTO_CHUNK)
        times = simulated_pairs(topology, request)
        pick = choose(request, topology, efficiency)
        assert times[pick] <= MARGIN * min(times.values()), (nbytes, pick, times)


def test_one_gb200_rack_without_nvls_weighs_the_ring_alone():
    """One GB200 rack with NVLS off is one NCCL node (MNNVL) of 18 trays. Inside one node NCCL's tree is a chain of
    its GPUs, which the `tree` here, a double binary tree over the ranks, is not, so `auto` weighs the
    ring alone, as inside one DGX host. It weighed the tree too, at 0.67-0.85 of its simulated time, and took the
    LL128 tree at 1 GiB: 5.00 ms (busbw 423 GB/s) where the LL128 ring simulates 3.53 ms (599 GB/s)."""
    topology = load_topology("gb200-nvl72", {"nvls": "none"})
    efficiency = calibrated(topology.gpu_model)
    ranks = tuple(range(topology.num_gpus))
    assert candidates(CollectiveRequest("all_reduce", ranks, MIB), topology, group_by_host(ranks, topology)) == ["ring"]
    for nbytes in (16 * MIB, GIB):
        request = CollectiveRequest("all_reduce", ranks, nbytes, chunk_bytes=AUTO_CHUNK)
        times = simulated_pairs(topology, request)
        pick = choose(request, topology, efficiency)
        assert pick.algorithm == "ring" and times[pick] == min(times.values()), (nbytes, pick, times)
        assert_estimate_holds(estimates(request, topology, efficiency, pick.protocol)["ring"], times[pick], "ring")


@pytest.mark.parametrize("protocol", ["simple", "ll128"])
def test_the_tree_over_one_rack_is_weighed_at_its_simulated_time(protocol):
    """One rack's tree asked for by name: the double binary tree over its 72 ranks, the rack one NVLink domain as
    a DGX host is. Planned over its trays' chains, the estimate held once it counted every edge on the links it
    crosses (counted apart, 0.67-0.85 of the simulated time)."""
    topology = load_topology("gb200-nvl72", {"nvls": "none"})
    efficiency = calibrated(topology.gpu_model)
    for nbytes in (16 * MIB, GIB):
        request = CollectiveRequest("all_reduce", tuple(range(topology.num_gpus)), nbytes, chunk_bytes=AUTO_CHUNK)
        estimate = estimates(request, topology, efficiency, protocol, algorithms=("tree",))["tree"]
        assert_estimate_holds(estimate, simulated(topology, request, "tree", protocol=protocol), "tree", nbytes)


def test_the_nvls_tree_is_weighed_only_on_gpus_that_drive_nvlink_sharp():
    """Hosts whose switches reduce but whose GPUs (A100) cannot drive NVLS: auto weighed the NVLS tree across
    them and ended every all-reduce there in 'nvls needs GPUs with NVLink SHARP', which nobody had asked for."""
    node = {"kind": "nvswitch_node", "gpu_model": "a100-80gb", "nvls": "nvswitch3"}
    topology = load_topology("dgx-h100-cluster", {"nodes": 2, "node": node})
    request = CollectiveRequest("all_reduce", tuple(range(16)), 64 * MIB, chunk_bytes=CHUNK)
    assert choose(request, topology, protocol="simple").algorithm == "ring"


@pytest.mark.parametrize(("nics", "ranks", "nvls_tree"), [(8, (0, 1, 8, 9), True), (4, (0, 1, 8, 9), False),
                                                          (4, (0, 2, 8, 10), True)])
def test_the_nvls_tree_needs_two_heads_on_every_host(nics, ranks, nvls_tree, monkeypatch):
    """NCCL runs its NVLS tree only on an NVLS graph of 2 channels or more, one per head: a member GPU that is
    a NIC's local GPU, none twice (tuning.cc, search.cc). Two H100s per host on NICs of their own make 2 heads, and
    NCCL weighs the tree there (simulated at 256 MiB in 2.92 ms against the double tree's 2.97 and the ring's 4.34,
    weighed at NCCL's cap of 2 heads x 57.7 GB/s, 3.56 ms); two sharing a NIC (4 NICs per host) make one, and auto
    weighed the NVLS tree there all the same. The ring's and the NVLS tree's estimates cross the NICs the members
    drive: with two members on one NIC the ring's was half its simulated 8.62 ms (it counted 2 rails)."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 2, "nics_per_node": nics})
    efficiency = calibrated(topology.gpu_model)
    request = CollectiveRequest("all_reduce", ranks, 256 * MIB, chunk_bytes=CHUNK)
    names = candidates(request, topology, group_by_host(ranks, topology))
    assert ("nvls" in names) is nvls_tree
    times = simulated_pairs(topology, request)
    pick = choose(request, topology, efficiency)
    assert times[pick] <= MARGIN * min(times.values()), (pick, times)
    monkeypatch.setattr(tuner, "nccl_capped", lambda request, terms, name, protocol, seconds: seconds)
    for algorithm, estimate in estimates(request, topology, efficiency, algorithms=("ring", "nvls")).items():
        assert estimate == pytest.approx(simulated(topology, request, algorithm), rel=1e-9), algorithm


OVERSUBSCRIBED = {"nodes": 8, "leaf_ports": 2, "spines": 2, "oversubscription": 4}
"""8 DGX H100s, a leaf per rail over every 2 hosts, 2 spines, uplinks at a quarter of the leaves' downlinks:
2 x 50 GB/s / 4 / 2 spines = 12.5 GB/s per leaf-spine link, a quarter of a NIC's 50."""


@pytest.mark.parametrize("per_host", [1, 8])
@pytest.mark.parametrize("channels", [0, 4])
def test_estimates_follow_the_channels_over_the_uplinks_of_an_oversubscribed_fabric(per_host, channels, monkeypatch):
    """The ring's and the tree's estimates load every link of the plans' own routes, as the engine does, the channels'
    flows hashed over the 2 spines, and each step of the tree across hosts takes the latency of the slowest route
    among its edges (hosts under one leaf or across the spines): both match the simulation exactly, and auto's pick
    is the fastest candidate. Read off one route between the first two hosts (two hosts of one leaf group, which no
    spine separates), they would come out 0.25 to 0.96 of the simulated ring and as little as 0.25 of the tree where
    the uplinks bind (1 GiB over one H100 per host on 2 channels: 40.2 against 80.2 ms); with one latency for every
    edge the tree would be 0.981 of its simulation (one H100 per host at 1 MiB)."""
    topology = load_topology("dgx-h100-cluster", OVERSUBSCRIBED)
    efficiency = calibrated(topology.gpu_model)
    ranks = tuple(range(0, topology.num_gpus, 8 // per_host))
    for nbytes in (MIB, GIB):
        request = CollectiveRequest("all_reduce", ranks, nbytes, chunk_bytes=CHUNK, channels=channels)
        for protocol in ("simple", "ll"):
            with monkeypatch.context() as uncapped:  # the estimate itself, not NCCL's cap on LL beside it
                uncapped.setattr(tuner, "nccl_capped", lambda request, terms, name, protocol, seconds: seconds)
                guesses = estimates(request, topology, efficiency, protocol, algorithms=("ring", "tree"))
            for algorithm, estimate in guesses.items():
                took = time_collective(topology, "all_reduce", algorithm, ranks, nbytes, efficiency=efficiency,
                                       chunk_bytes=CHUNK, channels=channels, protocol=protocol)
                assert estimate == pytest.approx(took, rel=1e-9), (algorithm, nbytes, protocol)
        times = {pair: time_collective(topology, "all_reduce", pair.algorithm, ranks, nbytes, efficiency=efficiency,
                                       chunk_bytes=CHUNK, channels=channels, protocol=pair.protocol)
                 for pair in (Choice(name, protocol) for name in candidates(request, topology,
                                                                            group_by_host(ranks, topology))
                              for protocol in protocols.available(name, "all_reduce", ranks, topology))}
        terms = group_terms(request, topology, efficiency)
        times = {pair: nccl_rated(request, terms, pair, seconds) for pair, seconds in times.items()}
        pick = choose(request, topology, efficiency)
        assert times[pick] <= MARGIN * min(times.values()), (nbytes, pick, times)


@pytest.mark.parametrize("profile", ["calibrated", "ideal"])
@pytest.mark.parametrize("hosts", [1, 2])
def test_auto_ranks_h100_candidates_as_the_simulation_does(hosts, profile):
    """8 and 2 x 8 H100s, 1 KiB to 4 GiB in steps of 2: the pick, weighed at the links' efficiencies the run
    gives the network model, is the fastest candidate in simulation at those efficiencies."""
    topology = load_topology("dgx-h100-cluster", {"nodes": hosts})
    efficiency = calibrated(topology.gpu_model) if profile == "calibrated" else {}
    ops = ["all_reduce", "reduce_scatter", "all_gather"] if hosts == 1 else ["all_reduce"]
    for op in ops:
        for nbytes in (KIB * 2**k for k in range(23)):
            request = CollectiveRequest(op, tuple(range(topology.num_gpus)), nbytes, chunk_bytes=CHUNK)
            times = simulated_pairs(topology, request, efficiency)
            pick = choose(request, topology, efficiency)
            assert times[pick] <= MARGIN * min(times.values()), (op, nbytes, pick, times)


def test_auto_weighs_the_links_at_the_runs_efficiency(monkeypatch):
    """Two DGX A100s, a 32 MiB all-reduce: at line rate the tree is the faster (simulated 439 us against the ring's
    461); at the calibrated efficiencies the ring is (481 against 507 us): the tree leans on its NVLink chains, and
    NVLink keeps 0.77 of its line rate there, InfiniBand, which bounds the ring, 0.94. Estimating at nominal
    bandwidths would take the tree under both. The scenario's efficiency reaches the run's plan cache. NCCL's
    caps are off here: they rate the tree at 188.8 GB/s busbw whatever the links' efficiency, and take the ring
    under both."""
    monkeypatch.setattr(tuner, "nccl_capped", lambda request, terms, name, protocol, seconds: seconds)
    monkeypatch.setattr(tuner, "KEPT", {})
    monkeypatch.setattr(tuner, "CHOICES", {})
    topology = load_topology("dgx-a100-cluster", {"nodes": 2})
    group = tuple(range(16))
    request = CollectiveRequest("all_reduce", group, 32 * MIB, chunk_bytes=CHUNK)
    op = CollectiveOp(id=0, rank=0, stream="dp", name="grads", op="all_reduce", group=group, nbytes=32 * MIB)
    for efficiency, fastest in (({}, "tree"), (calibrated(topology.gpu_model), "ring")):
        times = {algorithm: simulated(topology, request, algorithm, efficiency) for algorithm in ("ring", "tree")}
        assert min(times, key=times.__getitem__) == fastest, times
        assert choose(request, topology, efficiency, protocol="simple").algorithm == fastest
        settings = NetworkSettings(efficiency=tuple(sorted(efficiency.items())), chunk_bytes=CHUNK,
                                   protocol="simple")
        assert plan_cache(topology, settings).resolved_algorithm(op, group) == fastest


def pipeline_seconds(hops: int, chunks: int, chunk: float, latency: float, rate: float, line_rate: float) -> float:
    """A pipeline of ``chunks`` chunks over ``hops`` alike hops, by hand: the hops open one step after another, each
    step paying the latency and a chunk's time c / rate; the later L - 1 steps stream, NCCL's 8 slots in flight,
    a slot free again 2 (latency + s) after it was filled (s = c / line rate, as the plans read it), so each takes
    c / rate + max(0, 2 (latency + s) / 8 - s)."""
    s = chunk / line_rate
    return hops * (latency + chunk / rate) + (chunks - 1) * (chunk / rate + max(0.0, 2 * (latency + s) / 8 - s))


@pytest.mark.parametrize(("hosts", "op", "group", "algorithm", "passes", "pipelines", "hops"), [
    (1, "broadcast", tuple(range(8)), "ring", 1, 1, 7),  # the ring's chain over one host's 8 GPUs
    (2, "all_reduce", (0, 8), "tree", 2, 2, 1),  # two hosts' tree: up then down one hop, 2 channels' trees at once
])
def test_the_chain_and_tree_estimates_charge_the_window_stall(hosts, op, group, algorithm, passes, pipelines, hops):
    """With 16 KiB chunks a chunk crosses NVLink in 44 ns and InfiniBand in 350 ns, far under a third of the hop's
    latency (3.4 and 13 us): NCCL's 8 slots then hold the stream, each step waiting 0.82 us (NVLink) or 3.0 us
    (InfiniBand) for a slot. The estimate charges that stall as the plan does, so it equals the simulated time
    (3,574 us for the 64 MiB broadcast; 7,601 us for the all-reduce, whose 2 channels each run both trees, so
    that each direction of the hop carries 2 pipelines of n / 4 at half its rate), where leaving it out gave 17
    and 5 times less. ``passes`` run one after the other (the tree's up and down), ``pipelines`` at once over the
    hop, each of n / (passes pipelines), after NCCL's base latency of a Simple ring or tree, 8.4 us."""
    topology = load_topology("dgx-h100-cluster", {"nodes": hosts})
    efficiency = calibrated(topology.gpu_model)
    nbytes, chunk = 64 * MIB, 16 * KIB
    request = CollectiveRequest(op, group, nbytes, chunk_bytes=chunk)
    path = topology.path(group[0], group[1])
    rate = min(topology.link_bandwidth[i] * efficiency[topology.link_class[i]] for i in path) / pipelines
    line_rate = min(topology.link_bandwidth[i] for i in path)
    per_pipeline = nbytes / (passes * pipelines)
    latency = topology.path_latency(group[0], group[1])
    by_hand = NCCL_SIMPLE_BASE_S + passes * pipeline_seconds(hops, int(per_pipeline / chunk), chunk, latency, rate,
                                                             line_rate)
    stall_free = passes * (hops * latency + (hops + per_pipeline / chunk - 1) * chunk / rate)
    assert by_hand > 4.5 * stall_free
    assert simulated(topology, request, algorithm) == pytest.approx(by_hand, rel=1e-9)
    assert estimates(request, topology, efficiency)[algorithm] == pytest.approx(by_hand, rel=1e-9)


def test_equal_estimates_go_to_the_first_listed():
    """Two ranks on two hosts: the ring's and the tree's estimates are one closed form, 2 a + n / b, which summed in
    other orders comes out in different last bits (2,494.3148936170205 us for the tree against ...210 for the ring at
    55.3 MiB), so some sizes of a data-parallel pair could take the tree and others the ring; ties go to the ring,
    listed first. (Both simulate 1.88 ms there, the tree on every channel as the ring; both estimates are 1.33 times
    that: they read one route's bottleneck, the leaf's oversubscribed uplink, while the 4 channels hash over both
    spines.)"""
    topology = load_topology("dgx-h100-cluster", {"nodes": 4, "leaf_ports": 2, "spines": 2, "oversubscription": 2,
                                                  "nics_per_node": 4})
    efficiency = calibrated(topology.gpu_model)
    for nbytes in (27287552.0, 33579008.0, 57958400.0):
        request = CollectiveRequest("all_reduce", (0, 16), nbytes, chunk_bytes=CHUNK, channels=4)
        costs = estimates(request, topology, efficiency)
        assert costs["ring"] == pytest.approx(costs["tree"], rel=1e-12)
        assert choose(request, topology, efficiency, protocol="simple").algorithm == "ring"


def test_translated_groups_share_one_tree_shape():
    """Rails 0 and 3 of 4 DGX H100 hosts are the same group moved by 3 GPUs: one shape (members per host as
    positions, the NIC of each position numbered in order of first use), so the tree's edges are built once for
    both and for every size (`tree_passes`), and their tree estimates are equal. Rail 0 with a second member on
    host 0 is another shape."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 4})
    rail = [tuple(range(offset, 32, 8)) for offset in (0, 3)]
    shapes = [group_shape(group, group_by_host(group, topology), topology) for group in rail]
    assert shapes[0] == shapes[1] == (((0,), (1,), (2,), (3,)), (0, 1, 2, 3))
    wider = (0, 1, 8, 16, 24)
    assert group_shape(wider, group_by_host(wider, topology), topology) == (((0, 1), (2,), (3,), (4,)),
                                                                           (0, 1, 2, 3, 4))
    tree_passes.cache_clear()
    costs = [[estimates(CollectiveRequest("all_reduce", group, size), topology)["tree"] for size in (MIB, GIB)]
             for group in rail]
    assert costs[0] == costs[1]
    assert tree_passes.cache_info().misses == 1


def choice_case(topology, request: CollectiveRequest, efficiency, algorithm: str = "auto", protocol: str = "auto"
                ) -> tuple[tuple, dict, Choice]:
    """``choose``'s key for ``request`` (as `choose` builds it), the estimates of its own terms under every
    protocol weighed, and its pick, the caches (`CHOICES`, `SLOPES`) emptied first so that nothing is shared."""
    names = (algorithm,) if algorithm != "auto" else None
    wanted = PROTOCOLS if protocol == "auto" else (protocol,)
    terms = group_terms(request, topology, efficiency, names)
    CHOICES.clear()
    SLOPES.clear()
    return (choice_key(request, terms.key(), wanted), terms_estimates(request, terms, wanted),
            choose(request, topology, efficiency, algorithm, protocol))


def test_choices_are_shared_only_where_the_estimates_are_equal():
    """`choose` keeps its picks by the group's terms (`GroupTerms.key`: every figure the estimates read, no GPU
    or link named) and the request's op, size, chunk and protocols weighed, so that groups placed alike share
    one answer. The estimates read nothing of the request but its op, size and chunk (the same estimates come
    out for any other group, root or channel count), so equal keys give equal estimates and picks: checked over
    every group below on an oversubscribed fabric (8 DGX H100s, 2 per leaf group, 2 spines at 4:1), each op,
    two sizes, at line rate and calibrated: 432 picks, 132 keys (140 before the fabric's hash read the rails'
    difference; 128 while the ring's broadcast was weighed over one route, when 1 GiB from GPU 0 to 16 weighed
    85.9 ms as from 8 to 24, where the channels share one spine, and simulates 43.0). The 8 GPUs of each host
    share one key per op, size and efficiency, and so do the 8 rails (their links numbered in order of first
    use load alike)."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 8, "leaf_ports": 2, "spines": 2, "oversubscription": 4})
    hosts = [tuple(range(8 * host, 8 * host + 8)) for host in range(8)]
    rails = [tuple(range(rail, 64, 8)) for rail in range(8)]
    pairs = [(0, 8), (1, 9), (0, 16), (8, 24), (0, 1), (8, 9), (0, 63)]
    mixed = [(0, 1, 8, 9), (16, 17, 24, 25), (0, 1, 2, 8), (0, 8, 1, 9)]
    by_key: dict[tuple, tuple[dict, Choice]] = {}
    cases = 0
    for efficiency in (None, calibrated(topology.gpu_model)):
        for group in hosts + rails + pairs + mixed:
            for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
                for nbytes in (MIB, GIB):
                    request = CollectiveRequest(op, group, nbytes, chunk_bytes=CHUNK)
                    key, costs, pick = choice_case(topology, request, efficiency)
                    other = replace(request, ranks=tuple(range(40, 40 + len(group))), root=len(group) - 1,
                                    channels=3)
                    terms = group_terms(request, topology, efficiency)
                    assert terms_estimates(other, terms, PROTOCOLS) == costs
                    assert by_key.setdefault(key, (costs, pick)) == (costs, pick), (group, op, nbytes)
                    cases += 1
    # 2 efficiencies x 4 ops x 2 sizes x 27 groups; the 8 hosts share one key each time, as do the 8 rails
    assert cases == 432 and len(by_key) == 132
    for groups in (hosts, rails):
        assert len({choice_case(topology, CollectiveRequest("all_reduce", group, MIB), None)[0]
                    for group in groups}) == 1


def test_a_changed_input_changes_the_choice_key_or_no_estimate():
    """Changing any one input of a pick (each field of the request, the efficiencies, the algorithm or protocol
    asked for, the group's place, the topology's links) changes `choose`'s key, or leaves every estimate as it
    was: a root; the group moved by two leaf groups (4 hosts); two other GPUs of each host (NVLink alike, each
    member on a NIC of its own)."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 8, "leaf_ports": 2, "spines": 2, "oversubscription": 4})
    efficiency = calibrated(topology.gpu_model)
    base = CollectiveRequest("all_reduce", (0, 1, 8, 9, 16, 17), 8 * MIB, chunk_bytes=CHUNK)
    key, costs, _ = choice_case(topology, base, efficiency)
    changed = {
        "op": (topology, replace(base, op="all_gather"), efficiency, "auto", "auto"),
        "nbytes": (topology, replace(base, nbytes=9 * MIB), efficiency, "auto", "auto"),
        "chunk": (topology, replace(base, chunk_bytes=None), efficiency, "auto", "auto"),
        "channels": (topology, replace(base, channels=1), efficiency, "auto", "auto"),
        "root": (topology, replace(base, root=3), efficiency, "auto", "auto"),
        "ranks, alike": (topology, replace(base, ranks=(32, 33, 40, 41, 48, 49)), efficiency, "auto", "auto"),
        "ranks, other rails": (topology, replace(base, ranks=(0, 4, 8, 12, 16, 20)), efficiency, "auto", "auto"),
        "ranks, other hosts": (topology, replace(base, ranks=(0, 1, 16, 17, 32, 33)), efficiency, "auto", "auto"),
        "ranks, 3 per host": (topology, replace(base, ranks=(0, 1, 2, 8, 9, 10)), efficiency, "auto", "auto"),
        "efficiency": (topology, base, None, "auto", "auto"),
        "algorithm": (topology, base, efficiency, "tree", "auto"),
        "protocol": (topology, base, efficiency, "auto", "ll128"),
        "nics": (load_topology("dgx-h100-cluster", {"nodes": 8, "leaf_ports": 2, "spines": 2,
                                                    "oversubscription": 4, "nic_bandwidth": "25 GB/s"}),
                   base, efficiency, "auto", "auto"),
        "uplinks": (load_topology("dgx-h100-cluster", {"nodes": 8, "leaf_ports": 2, "spines": 2,
                                                       "oversubscription": 2}), base, efficiency, "auto", "auto"),
    }
    unchanged = set()
    for name, (where, request, asked_efficiency, algorithm, protocol) in changed.items():
        other_key, other_costs, _ = choice_case(where, request, asked_efficiency, algorithm, protocol)
        if other_key == key:
            assert other_costs == costs, name
            unchanged.add(name)
    assert unchanged == {"root", "ranks, alike", "ranks, other rails"}


def test_choose_weighs_a_group_once_up_to_whole_periods_of_the_fabric():
    """`choose` finds a group's terms and their key once for the group and every translate of it by whole periods
    of the fabric's spine hash (16 GPUs here, a leaf group of 2 hosts): the translates cross links alike, so their
    terms are equal; the 16k-GPU job's 4,366 groups and ops come to 320 terms so. On a fabric whose partial last
    pod has narrower core links (`Periods.exact` false) every group keeps its own, as the translate there picks
    another algorithm (tests/test_periods.py)."""
    topology = load_topology("dgx-h100-cluster", OVERSUBSCRIBED)
    efficiency = calibrated(topology.gpu_model)
    group = (0, 1, 8, 9)
    moved = tuple(rank + 2 * 16 for rank in group)
    assert first_period_translate(topology, moved) == group
    request = CollectiveRequest("all_reduce", group, 8 * MIB, chunk_bytes=CHUNK)
    weighed = weighed_group(request, topology, efficiency, "auto")
    assert weighed_group(replace(request, ranks=moved), topology, efficiency, "auto") is weighed
    assert weighed.key == group_terms(replace(request, ranks=moved), topology, efficiency).key()
    partial = build_topology("cluster", {"nodes": 5, "leaf_ports": 1, "tiers": 3, "pods": 3, "spines": 1, "cores": 4,
                                         "nics_per_node": 1, "oversubscription": 4, "node": {"gpus": 2}})
    assert first_period_translate(partial, (4, 5, 8, 6, 7, 9)) == (4, 5, 8, 6, 7, 9)


@pytest.mark.parametrize("name, hosts, op, nbytes", [
    ("dgx-a100-cluster", 2, "all_reduce", 1 * MIB), ("dgx-a100-cluster", 2, "all_reduce", 4 * MIB),
    ("dgx-h100-cluster", 16, "all_reduce", 4 * MIB), ("dgx-h100-cluster", 16, "all_reduce", 8 * MIB),
    ("dgx-h100-cluster", 2, "broadcast", 64 * MIB)])
def test_auto_takes_ll_no_faster_than_nccls_cap(name, hosts, op, nbytes):
    """NCCL's tuner caps LL's busbw (tuning.cc `llMaxBws`): 22.5 GB/s over 2 DGX A100s (AMD CPUs), 20.4 over more
    than 2 Intel hosts, 39 over 2. With NCCL's chunks auto took LL past them: the LL ring over 2 DGX A100s at
    1 MiB (52.7 us, busbw 37 GB/s) and 4 MiB (115.4 us, 68 GB/s), the LL tree over 16 DGX H100s at 4 and 8 MiB
    (52.9 and 82.5 GB/s), the LL ring's 64 MiB broadcast over 2 DGX H100s (159.5 GB/s)."""
    topology = load_topology(name, {"nodes": hosts})
    request = CollectiveRequest(op, tuple(range(topology.num_gpus)), nbytes, chunk_bytes="auto")
    assert choose(request, topology, calibrated(topology.gpu_model)).protocol != "ll"


def test_nccls_ll128_caps_by_gpu_hosts_and_channels():
    """`perChMaxRingLL128Bws` and `perChMaxTreeLL128Bws` in GB/s per channel, times the channels: the ring's by
    the GPU's generation alone (Ampere 20, Hopper 36.7, Blackwell 40), the tree's by generation and 1, 2 or
    more hosts (Hopper 36.7, 36.7, 29; Blackwell 55.6, 31.67, 20)."""
    assert [tuple(round(cap / 1e9, 6) for cap in ll128_bus_caps(gpu, hosts, channels)) for gpu, hosts, channels in [
        ("a100-80gb", 2, 16), ("h100-sxm", 1, 32), ("h100-sxm", 16, 16), ("b200", 2, 16), ("b200", 4, 16)]] == [
        (320.0, 320.0), (1174.4, 1174.4), (587.2, 464.0), (640.0, 506.72), (640.0, 320.0)]


def test_the_ll128_tree_is_weighed_no_faster_than_nccls_cap():
    """4 DGX B200-like hosts (8 B200s each, 8 NICs of 50 GB/s): NCCL caps the LL128 tree's busbw at 120/128 of the
    tree's own cap (its search's 8 channels x 24 GB/s: 180 GB/s) and at 20 GB/s a channel over more than 2 Blackwell
    hosts on those same 8 channels (160 GB/s; the kernel runs 16), so a 1 GiB all-reduce is weighed at its own
    estimate's latency + 2 x 1 GiB / 160 GB/s = 13.65 ms, above the 6.319 ms its plan simulates (busbw 340 GB/s)."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 4, "node": {"gpu_model": "b200",
                                                                       "nvlink_bandwidth": "900 GB/s"}})
    efficiency = calibrated(topology.gpu_model)
    request = CollectiveRequest("all_reduce", tuple(range(32)), GIB, chunk_bytes="auto")
    assert nccl_channels(topology, request.ranks) == 16
    weighed = estimates(request, topology, efficiency, "ll128", algorithms=("tree",))["tree"]
    assert weighed == pytest.approx(tree_line(request, topology, efficiency, "ll128", 160e9), rel=1e-12)
    assert weighed * 1e3 == pytest.approx(13.65, abs=0.005)
    assert weighed > simulated(topology, request, "tree", protocol="ll128")


@pytest.mark.parametrize("racks, trays, nodes", [(1, 18, 1), (2, 4, 2), (4, 2, 4)])
def test_nccls_caps_count_nvlink_domains_as_its_nodes(racks, trays, nodes):
    """Under MNNVL NCCL's nNodes, which indexes `llMaxBws` and `perChMaxTreeLL128Bws`, counts NVLink domains: a
    GB200 rack is one node to it (LL cap 282 GB/s, the LL128 tree's 55.6 GB/s a channel), not 18 trays (whose
    caps would read 20.4 and 20). The LL128 caps multiply the kernel's channels inside one node, the search's
    across nodes."""
    topology = load_topology("gb200-nvl72", {"racks": racks, "trays": trays})
    ranks = tuple(range(topology.num_gpus))
    terms = group_terms(CollectiveRequest("all_reduce", ranks, MIB), topology, calibrated(topology.gpu_model))
    channels = nccl_channels(topology, ranks) if nodes == 1 else terms.channels
    ring_ll128, tree_ll128 = ll128_bus_caps("gb200", nodes, channels)
    assert (terms.caps.of("ring", "ll"), terms.caps.of("ring", "ll128")) == (ll_bus_cap("gb200", nodes), ring_ll128)
    assert terms.caps.of("tree", "ll128") <= tree_ll128
    if nodes == 1:
        assert (terms.caps.of("ring", "ll"), tree_ll128) == (282e9, channels * 55.6e9)


def test_nccls_ll_caps_by_gpu_and_hosts():
    """`llMaxBws` in GB/s: one host by the GPU's generation, across hosts by the CPU (A100 hosts AMD, others not)."""
    assert [ll_bus_cap(gpu, hosts) / 1e9 for gpu, hosts in [
        ("a100-80gb", 1), ("a100-80gb", 2), ("a100-80gb", 4), ("h100-sxm", 1), ("h100-sxm", 2), ("h100-sxm", 16),
        ("b200", 1)]] == [87.7, 22.5, 19.0, 141.0, 39.0, 20.4, 282.0]


def test_the_tree_is_weighed_no_faster_than_nccls_cap_under_every_protocol():
    """12 GB200 racks with NVLS off: NCCL's tuner caps the tree all-reduce's busbw at its search's 16 channels x
    24 GB/s over more than 2 Blackwell nodes (`perChMaxTreeBws`) under every protocol, so 4 GiB weighs the Simple
    tree on one line, its own estimate's latency plus 2 x 4 GiB / 384 GB/s (26.91 ms), not the 17.23 ms its plan
    simulates, and `auto` takes the LL128 ring (19.57 ms)."""
    topology = load_topology("gb200-nvl72", {"racks": 12, "nvls": "none"})
    efficiency = calibrated(topology.gpu_model)
    request = CollectiveRequest("all_reduce", tuple(range(topology.num_gpus)), 4 * GIB, chunk_bytes="auto")
    weighed = estimates(request, topology, efficiency, "simple", algorithms=("tree",))["tree"]
    assert weighed == pytest.approx(tree_line(request, topology, efficiency, "simple", 16 * 24e9), rel=1e-12)
    assert weighed * 1e3 == pytest.approx(26.91, abs=0.005)
    assert choose(request, topology, efficiency) == Choice("ring", "ll128")


def test_the_trees_slope_is_found_once_per_group_chunk_and_protocol(monkeypatch):
    """The capped tree's line takes its slope from the tree's own estimate at 64 and 128 GiB
    (`tuner.tree_seconds_per_byte`), which no size changes: 16 DGX H100s weighing 14 sizes under 3 protocols
    estimate the tree at those sizes 6 times (2 a protocol), not 84, and every weighing is the one found with the
    slopes emptied first, bit for bit."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 16})
    efficiency = calibrated(topology.gpu_model)
    requests = [CollectiveRequest("all_reduce", tuple(range(128)), MIB << k, chunk_bytes="auto") for k in range(14)]
    terms = group_terms(requests[0], topology, efficiency)
    assert "tree" in terms.names
    fresh = []
    for request in requests:
        SLOPES.clear()
        fresh.append(terms_estimates(request, terms, PROTOCOLS))
    estimate, far = tuner._estimate, []

    def counted(request: CollectiveRequest, *rest) -> float:
        far.extend([request.nbytes] if request.nbytes >= SLOPE_BYTES else [])
        return estimate(request, *rest)

    monkeypatch.setattr(tuner, "_estimate", counted)
    SLOPES.clear()
    assert [terms_estimates(request, terms, PROTOCOLS) for request in requests] == fresh
    assert len(far) == 2 * len(PROTOCOLS)


def test_kept_slopes_weigh_as_fresh_ones_across_groups_sizes_efficiencies_and_chunks():
    """A slope kept (`SLOPES`) weighs as the slopes emptied first do, bit for bit, however the weighings before it
    ran: groups of 16 DGX H100s (every GPU, a rail, two per host, four hosts, an uneven three hosts), all-reduce
    and broadcast, two sizes, at line rate, calibrated and with NVLink alone at half its rate (the tree's links
    across hosts as at line rate, its NVLink hop not), each under chunk `auto`, none and 1 MiB, weighed in
    sequence with the slopes kept. A slope key without the chunk, the NVLink hop or the tree's terms gives
    another group's or chunk's slope (the 128-GPU LL tree under chunk `auto`: 0.575 s kept for 0.421 fresh)."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 16})
    groups = [tuple(range(128)), tuple(range(0, 128, 8)), tuple(rank for host in range(0, 128, 8)
              for rank in (host, host + 1)), tuple(range(32)), (0, 1, 2, 8, 9, 16)]
    cases = [(group_terms(CollectiveRequest(op, group, MIB), topology, efficiency), op, group)
             for efficiency in (None, calibrated(topology.gpu_model), {"nvlink": 0.5})
             for group in groups for op in ("all_reduce", "broadcast")]
    requests = [(terms, CollectiveRequest(op, group, nbytes, chunk_bytes=chunk)) for terms, op, group in cases
                for nbytes in (MIB, GIB) for chunk in ("auto", None, MIB)]
    SLOPES.clear()
    kept = [terms_estimates(request, terms, PROTOCOLS) for terms, request in requests]
    fresh = []
    for terms, request in requests:
        SLOPES.clear()
        fresh.append(terms_estimates(request, terms, PROTOCOLS))
    assert kept == fresh


def test_the_slopes_hold_each_trees_key_once_and_a_bounded_size_of_keys(monkeypatch):
    """`SLOPES` holds a tree's key (its links' bytes) once for all its chunks and protocols, and drops every slope
    when the keys held would pass `SLOPE_KEY_BYTES_KEPT`: with room for the key of 16 DGX H100s' tree, weighing
    it under two chunks keeps 6 slopes on one key, and then weighing a rail's tree keeps that key alone."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 16})
    every, rail = (group_terms(CollectiveRequest("all_reduce", group, MIB), topology, None)
                   for group in (tuple(range(128)), tuple(range(0, 128, 8))))
    sizes = [tuner.held_bytes(terms.tree.key()) for terms in (every, rail)]
    monkeypatch.setattr(tuner, "SLOPE_KEY_BYTES_KEPT", sizes[0])
    SLOPES.clear()
    for chunk in ("auto", None):
        terms_estimates(CollectiveRequest("all_reduce", tuple(range(128)), MIB, chunk_bytes=chunk), every, PROTOCOLS)
    assert [len(slopes) for slopes in SLOPES.by_tree.values()] == [6] and SLOPES.held == sizes[0]
    terms_estimates(CollectiveRequest("all_reduce", tuple(range(0, 128, 8)), MIB), rail, PROTOCOLS)
    assert list(SLOPES.by_tree) == [rail.tree.key()] and SLOPES.held == sizes[1] > 0


@pytest.mark.parametrize("name, over", [
    ("gb200-nvl72", {"racks": 12, "nvls": "none"}), ("gb200-nvl72", {"racks": 20, "nvls": "none"}),
    ("dgx-a100-cluster", {"nodes": 2}), ("dgx-a100-cluster", {"nodes": 16}),
    ("dgx-h100-cluster", {"nodes": 2}), ("dgx-h100-cluster", {"nodes": 16})])
def test_auto_picks_hold_unbroken_size_ranges_under_nccls_tree_caps(name, over):
    """Under NCCL's model each candidate is one line (latency + size / capped busbw), so from 1 MiB to 8 GiB each
    algorithm `auto` picks holds one unbroken range of sizes: the capped tree is weighed on one line, its own
    estimate's latency plus the size at the lower of its own busbw and the cap. All-reduce over every GPU."""
    topology = load_topology(name, over)
    efficiency = calibrated(topology.gpu_model)
    ranks = tuple(range(topology.num_gpus))
    picks = [choose(CollectiveRequest("all_reduce", ranks, MIB << k, chunk_bytes="auto"), topology,
                    efficiency).algorithm for k in range(14)]
    changes = [(a, b) for a, b in zip(picks, picks[1:]) if a != b]
    assert len(set(picks)) == len(changes) + 1, picks


def test_the_nvls_tree_is_weighed_no_faster_than_nccls_cap():
    """16 DGX H100s: NCCL caps the NVLS tree's busbw at its 8 heads a host x 45.5 GB/s over more than 2 Hopper
    nodes (`perChMaxNVLSTreeBws`), 364 GB/s, so a 64 MiB all-reduce weighs `nvls` at its 192.2 us latency floor
    plus 2 x 127/128 x 64 MiB / 364 GB/s = 558.0 us, above the 549.2 us of its plan's load; `auto` takes
    `nvls`, since NCCL caps the LL128 tree below it, at min(120/128 x 8 x 36 GB/s, 8 x 29 GB/s) = 232 GB/s on its
    search's 8 channels, weighed from its own estimate's latency (755.4 us)."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 16})
    efficiency = calibrated(topology.gpu_model)
    request = CollectiveRequest("all_reduce", tuple(range(128)), 64 * MIB, chunk_bytes="auto")
    weighed = estimates(request, topology, efficiency, algorithms=("nvls",))["nvls"]
    assert weighed == pytest.approx(25e-6 + 8 * 20.9e-6 + 2 * 127 / 128 * 64 * MIB / 364e9, rel=1e-12)
    tree_ll128 = estimates(request, topology, efficiency, "ll128", algorithms=("tree",))["tree"]
    assert tree_ll128 == pytest.approx(tree_line(request, topology, efficiency, "ll128", 232e9), rel=1e-12)
    assert choose(request, topology, efficiency) == Choice("nvls", "simple")


@pytest.mark.parametrize("name, over, step, caps", [
    ("gb200-nvl72", {"racks": 20, "nvls": "none"}, 1, (384.0, 320.0, 20.4)),
    ("dgx-a100-cluster", {"nodes": 2}, 1, (188.8, 160.0, 22.5)),
    ("dgx-h100-cluster", {"nodes": 4}, 8, (61.2, 49.3, 16.105263))])
def test_nccls_tree_caps_by_protocol_and_members_per_node(name, over, step, caps):
    """The tree's caps (GB/s) under Simple, LL128 and LL as `bus_caps` finds them for every ``step``-th GPU of a
    cluster, on the search's channels: `perChMaxTreeBws` times them under Simple; LL128 no more than 120/128 of
    that nor its own cap; LL no more than 1/3.8 of it nor LL's cap; all at 0.85 where a node holds one member
    (NCCL_TOPO_PATTERN_TREE). 20 GB200 racks: 16 channels x 24 GB/s, LL128's 16 x 20, LL's 20.4; 2 DGX A100s:
    8 x 23.6, LL128's 8 x 20, LL's 22.5; one GPU on each of 4 DGX H100s: 2 channels x 36 x 0.85, LL128's
    2 x 29 x 0.85, 1/3.8 of 72 x 0.85."""
    topology = load_topology(name, over)
    ranks = tuple(range(0, topology.num_gpus, step))
    terms = group_terms(CollectiveRequest("all_reduce", ranks, MIB), topology, calibrated(topology.gpu_model))
    assert tuple(round(cap / 1e9, 6) for cap in terms.caps.tree) == caps


def test_the_lone_member_share_lowers_the_trees_rating(monkeypatch):
    """9 GPUs, 8 on one DGX H100 and 1 on another: a node holds one member, so NCCL rates the tree at 0.85 of its
    caps on the search's 2 channels (`LONE_TREE_SHARE`): a 64 MiB all-reduce weighs the Simple tree at its own
    estimate's latency + 2 x 64 MiB / (0.85 x 2 x 41.4 GB/s) = 2,329.6 us and the LL128 tree at 0.85 x 2 x 36.7
    GB/s (2,411.3 us), and `auto` takes the Simple tree; at the full caps the Simple tree weighs 2,043.6 us."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 2})
    efficiency = calibrated(topology.gpu_model)
    request = CollectiveRequest("all_reduce", tuple(range(9)), 64 * MIB, chunk_bytes="auto")
    weighed = estimates(request, topology, efficiency, "simple", algorithms=("tree",))["tree"]
    assert weighed == pytest.approx(tree_line(request, topology, efficiency, "simple", 0.85 * 2 * 41.4e9), rel=1e-12)
    assert weighed * 1e6 == pytest.approx(2329.6, abs=0.05)
    assert choose(request, topology, efficiency) == Choice("tree", "simple")
    monkeypatch.setattr(tuner, "LONE_TREE_SHARE", 1.0)
    monkeypatch.setattr(tuner, "KEPT", {})
    monkeypatch.setattr(tuner, "CHOICES", {})
    full = estimates(request, topology, efficiency, "simple", algorithms=("tree",))["tree"]
    assert full == pytest.approx(tree_line(request, topology, efficiency, "simple", 2 * 41.4e9), rel=1e-12)
    assert full * 1e6 == pytest.approx(2043.6, abs=0.05)
