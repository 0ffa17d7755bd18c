"""Collectives across GB200 NVL72 racks planned by NVLink domain, as NCCL under MNNVL plans them (a rack of 18
trays is one node with 72 NICs): the ring's channels, hierarchical's levels, the tree and NVLS across racks against
their closed forms at line rate (Simple, chunking off, efficiency 1), on two racks under one leaf group per rail
(``leaf_ports: 36``), where every hop between the racks runs at the NIC's line rate."""

from __future__ import annotations

import pytest
from shared import GIB, NCCL_SIMPLE_BASE_S

from simulator.collectives import nvls, protocols, ring, tuner
from simulator.collectives.execute import time_collective
from simulator.collectives.phases import CollectiveRequest
from simulator.collectives.registry import plan_collective
from simulator.collectives.tuner import choose, estimates
from simulator.errors import ScenarioError
from simulator.topology.loader import load_topology

BASE = NCCL_SIMPLE_BASE_S
NVLINK = 900e9
NIC = 50e9
RACK = 72
TWO_RACKS = load_topology("gb200-nvl72", {"racks": 2, "leaf_ports": 36})
EVERY_GPU = tuple(range(2 * RACK))
LINE_RATE = {"nvlink": 1.0, "infiniband": 1.0, "pcie": 1.0}


def latency(src: int, dst: int) -> float:
    """The latency of the route from GPU ``src`` to GPU ``dst``."""
    return TWO_RACKS.route(src, dst)[1]


def crossings(op: str, algorithm: str) -> list:
    """The transfers of the plan of ``op`` over both racks that cross from one rack to the other."""
    domain = TWO_RACKS.gpu_domain
    request = CollectiveRequest(op, EVERY_GPU, GIB)
    return [transfer for phase in plan_collective(request, TWO_RACKS, algorithm) for transfer in phase.transfers
            if domain[transfer.src] != domain[transfer.dst]]


def test_ring_across_racks_runs_nccls_sixteen_channels_each_on_its_own_nics():
    """A rack is one node: the ring finds a channel per NIC its members drive there, at most the 16 NCCL's search
    finds (`ring.RING_SEARCH_CHANNELS`), so the 144-GPU ring crosses between the racks on 16 NICs each way, not
    on the 4 a tray's rails would give (busbw capped at 200 GB/s)."""
    across = crossings("all_reduce", "ring")
    assert len({transfer.channel for transfer in across}) == 16
    nic = TWO_RACKS.gpu_nic
    assert len({nic[transfer.src] for transfer in across}) == 2 * 16
    assert len({nic[transfer.dst] for transfer in across}) == 2 * 16


def test_ring_all_reduce_across_racks_matches_its_closed_form():
    """Each of the 2 (p-1) steps waits on the rings' crossings: each carries n / (p C) over its NIC (the NVLink
    hops carry n / p per GPU at 900 GB/s, less than n / (16 p) at 50 GB/s), after the mean latency of a ring's
    hops (NCCL's ring latency model): 2 of its 144 cross between the racks, the rest over NVLink. 3.68 ms for
    1 GiB, busbw 582 GB/s; by tray, on 4 channels, it took 11.68 ms."""
    p, channels = 2 * RACK, 16
    hop = ((p - 2) * latency(0, 1) + 2 * latency(0, RACK)) / p
    step = hop + GIB / (p * channels) / NIC
    expected = BASE + 2 * (p - 1) * step
    simulated = time_collective(TWO_RACKS, "all_reduce", "ring", EVERY_GPU, GIB, efficiency=LINE_RATE)
    assert simulated == pytest.approx(expected, rel=1e-9)


def test_hierarchical_all_reduce_across_racks_runs_the_rack_as_its_inner_level():
    """2(g-1) a_in + 2(g-1)/g n b_in + 2(N-1) a_out + 2(N-1)/N (n/g) b_out with g = 72 (the rack) and N = 2: 3.17
    ms for 1 GiB. Planned by tray (g = 4, N = 36) it took 12.54 ms: 3/4 of the data left every tray over its NICs."""
    g, count = RACK, 2
    expected = (BASE + 2 * (g - 1) * latency(0, 1) + 2 * (g - 1) / g * GIB / NVLINK
                + 2 * (count - 1) * latency(0, RACK) + 2 * (count - 1) / count * (GIB / g) / NIC)
    simulated = time_collective(TWO_RACKS, "all_reduce", "hierarchical", EVERY_GPU, GIB, efficiency=LINE_RATE)
    assert simulated == pytest.approx(expected, rel=1e-9)
    assert simulated == pytest.approx(3.17e-3, rel=2e-3)


def test_tree_across_racks_runs_one_chain_per_rack_under_a_tree_of_racks():
    """NCCL's tree with the rack as its node (connect.cc connectTrees, trees.cc ncclGetDtree): on each of the
    ring's 16 channels (init.cc: the tree graph takes the ring graph's channels) one chain through the rack's 72
    GPUs over NVLink, from GPU c, the local GPU of the channel's NIC (search.cc ncclTopoSearchRecNet), to the
    next in turn, and a tree of the racks whose edges join the chains' heads on that NIC's rail. By tray it ran 36
    chains of 4 GPUs a channel under a tree of trays."""
    domain, local = TWO_RACKS.gpu_domain, TWO_RACKS.gpu_domain_local
    request = CollectiveRequest("all_reduce", EVERY_GPU, GIB)
    edges = {(transfer.src, transfer.dst, transfer.channel)
             for phase in plan_collective(request, TWO_RACKS, "tree") for transfer in phase.transfers}
    assert {channel for _, _, channel in edges} == set(range(16))
    for channel in range(16):
        across = {(local[src], local[dst]) for src, dst, each in edges
                  if each == channel and domain[src] != domain[dst]}
        assert across == {(channel, channel)}
        for rack in range(2):
            inside = {frozenset((local[src], local[dst])) for src, dst, each in edges
                      if each == channel and domain[src] == domain[dst] == rack}
            chain = [(channel + k) % RACK for k in range(RACK)]
            assert inside == {frozenset(pair) for pair in zip(chain, chain[1:])}


def test_tree_all_reduce_across_racks_matches_its_closed_form():
    """Unpipelined (one chunk) each tree of a channel moves h = n / 32 one hop a step. Up, the 71 steps inside the
    racks send two shares from one GPU (both trees run the channel's chain), then the heads cross on their NICs;
    down, the heads cross first (beside their chain's first hop), then 70 steps in which a GPU sends channel c's
    first tree's share and channel c + 1's second tree's (the chains shift by one GPU a channel), and the last hop
    of one tree. 12.41 ms for 1 GiB; by tray, over 36 trays' chains of 4, 24.75 ms."""
    share, hop, across = GIB / 32, latency(0, 1), latency(0, RACK)
    expected = (protocols.base_latency("tree", "simple") + (71 + 70) * (hop + 2 * share / NVLINK)
                + 2 * (across + share / NIC) + hop + share / NVLINK)
    simulated = time_collective(TWO_RACKS, "all_reduce", "tree", EVERY_GPU, GIB, efficiency=LINE_RATE)
    assert simulated == pytest.approx(expected, rel=1e-9)
    assert simulated == pytest.approx(12.41e-3, rel=1e-3)


@pytest.mark.parametrize("racks", [2, 4])
@pytest.mark.parametrize("protocol", ["simple", "ll128"])
def test_tree_estimate_across_racks_equals_its_simulated_time(monkeypatch, racks, protocol):
    """`auto` estimates the tree over racks as it plans it, NCCL's chunks and all: its edges across racks on the
    NICs' hop (their latency scaled for the network under LL128, not NVLink's, which the first two trays' hop
    gave). The estimate itself, before NCCL's cap weighs it (`nccl_capped`), equals the simulated time (16 MiB,
    line rate)."""
    topology = TWO_RACKS if racks == 2 else load_topology("gb200-nvl72", {"racks": 4, "leaf_ports": 72})
    request = CollectiveRequest("all_reduce", tuple(range(racks * RACK)), 16 * 2**20, chunk_bytes="auto")
    simulated = time_collective(topology, "all_reduce", "tree", request.ranks, request.nbytes, efficiency=LINE_RATE,
                                protocol=protocol, chunk_bytes="auto")
    monkeypatch.setattr(tuner, "nccl_capped", lambda request, terms, name, protocol, seconds: seconds)
    assert estimates(request, topology, LINE_RATE, protocol, ("tree",))["tree"] == pytest.approx(simulated, rel=1e-9)


def test_nvls_across_racks_reduces_in_each_racks_switches():
    """NCCL's NVLS tree with the rack as its node: the in-switch all-reduce over the rack's 72 GPUs (n 73/72 over
    each GPU's switch link at the in-switch efficiency) and, at once, the tree over the racks' heads, which
    the NVLink level outlasts; NCCL's NVLS tree latency over 2 nodes. By tray it reduced in groups of 4 (n 5/4 per
    link) and sent n/4 per GPU over its NIC: 10.71 ms for 1 GiB, not 1.70."""
    in_switch = GIB * (RACK + 1) / RACK / nvls.in_switch_efficiency(TWO_RACKS) / NVLINK
    assert in_switch > GIB / RACK / NIC
    simulated = time_collective(TWO_RACKS, "all_reduce", "nvls", EVERY_GPU, GIB, efficiency=LINE_RATE)
    assert simulated == pytest.approx(nvls.LATENCY + 2 * nvls.TREE_NET_LATENCY + in_switch, rel=1e-9)


def test_auto_weighs_the_nvls_tree_across_racks_over_the_racks():
    """The NVLS tree's latency counts NCCL's nodes, the racks: `auto`'s estimate charged 2 log2(36 trays) levels
    of 20.9 us where the plan waits one level over 2 racks (275.8 us against 66.8), 12% over its 1 GiB time."""
    request = CollectiveRequest("all_reduce", EVERY_GPU, GIB)
    simulated = time_collective(TWO_RACKS, "all_reduce", "nvls", EVERY_GPU, GIB, efficiency=LINE_RATE)
    assert estimates(request, TWO_RACKS, LINE_RATE)["nvls"] == pytest.approx(simulated, rel=1e-9)


def test_uneven_group_across_racks_is_refused_by_nvlink_domain():
    """An uneven group over two racks (every GPU of one, 4 of the other) is refused by what the plan groups by, the
    NVLink domain, not "on every host", where a rack's trays (hosts) hold 4 members each."""
    ranks = (*range(RACK), *range(RACK, RACK + 4))
    with pytest.raises(ScenarioError) as info:
        plan_collective(CollectiveRequest("all_reduce", ranks, GIB), TWO_RACKS, "nvls")
    assert info.value.problem.startswith("nvls all_reduce needs the same number of group members on every NVLink "
                                         "domain (rack), got 4, 72")


def bytes_out_of_rack(algorithm: str, topology, racks: int) -> dict[int, float]:
    """Bytes each GPU sends out of its rack in the plan of a 1 GiB all-reduce over every GPU of ``racks``."""
    domain = topology.gpu_domain
    request = CollectiveRequest("all_reduce", tuple(range(racks * RACK)), GIB)
    sent: dict[int, float] = {}
    for phase in plan_collective(request, topology, algorithm):
        for transfer in phase.transfers:
            if domain[transfer.src] != domain[transfer.dst]:
                sent[transfer.src] = sent.get(transfer.src, 0.0) + transfer.nbytes
    return sent


def test_nvls_across_two_racks_runs_nccls_tree_over_32_heads():
    """NCCL's NVLS tree across nodes is a double binary tree per head (connect.cc connectNvls), 32 heads a rack
    (search.cc: min(NCCL_MAX_NVLS_ARITY, GPUs), one per NIC): over 2 racks each head sends n/32 to its peer head,
    n/64 on each tree, not 72 rail rings with every GPU sending n/72 out of its rack."""
    sent = bytes_out_of_rack("nvls", TWO_RACKS, 2)
    local = TWO_RACKS.gpu_domain_local
    assert sorted({local[rank] for rank in sent}) == list(range(32))
    assert len(sent) == 2 * 32
    assert set(sent.values()) == {GIB / 32}


def test_nvls_tree_over_four_racks_loads_an_interior_head_with_twice_its_slice():
    """Over more than 2 nodes a head interior in one tree (2 children and a parent) and a leaf in the other
    sends 2 n/heads, as NCCL's tuner charges the NVLS tree (tuning.cc: interBw per channel, doubled only for
    nNodes <= 2); a leaf in both sends n/heads."""
    sent = bytes_out_of_rack("nvls", load_topology("gb200-nvl72", {"racks": 4}), 4)
    assert max(sent.values()) == pytest.approx(2 * GIB / 32, rel=1e-12)
    assert min(sent.values()) == pytest.approx(GIB / 32, rel=1e-12)


def test_auto_across_racks_takes_nccls_default_nvls_tree_and_the_ring_with_nvls_off():
    """NCCL enables NVLS wherever the GPUs report multicast (NCCL_NVLS_ENABLE=2) and runs NVLS_TREE across MNNVL
    cliques, so `auto` takes `nvls` over two racks; with NVLS off (`nvls: none`, the NCCL_NVLS_ENABLE=0 of the
    CoreWeave 20-rack run) it takes the ring. A pin of the pick, whichever NVLS plan runs across racks."""
    request = CollectiveRequest("all_reduce", EVERY_GPU, GIB)
    assert choose(request, load_topology("gb200-nvl72", {"racks": 2})).algorithm == "nvls"
    assert choose(request, load_topology("gb200-nvl72", {"racks": 2, "nvls": "none"})).algorithm == "ring"


PARTLY_USED = load_topology("gb200-nvl72", {"racks": 2, "trays": 4, "last_rack_trays": 2})
"""Two racks of 4 trays, the last using 2 of them: every GPU is 4 trays x 4 on one rack, 2 x 4 on the other."""


def test_hierarchical_over_a_partly_used_last_rack_plans_by_tray():
    """Racks holding unequal counts (16 and 8) where every tray holds 4: hierarchical plans by tray (NCCL has no
    hierarchical algorithm to follow), so it runs, and with it every elastic GB200 job whose shrunk sizes leave a
    rack partly used."""
    every_gpu = tuple(range(PARTLY_USED.num_gpus))
    phases = plan_collective(CollectiveRequest("all_reduce", every_gpu, GIB), PARTLY_USED, "hierarchical")
    host = PARTLY_USED.gpu_host
    inner = {(host[transfer.src], host[transfer.dst]) for transfer in phases[0].transfers}
    assert all(src == dst for src, dst in inner)
    assert len(inner) == 6


def test_a_group_uneven_on_racks_and_trays_is_refused_naming_the_rack():
    """Uneven by rack and by tray (4 members on one rack, 2 on one tray of the other): the refusal names the
    NVLink domain as a rack, not a "host", the word users read as the tray."""
    ranks = (0, 4, 8, 12, 16, 17)
    with pytest.raises(ScenarioError) as info:
        plan_collective(CollectiveRequest("all_reduce", ranks, GIB), PARTLY_USED, "hierarchical")
    assert info.value.problem.startswith("hierarchical all_reduce needs the same number of group members on every "
                                         "NVLink domain (rack), got 2, 4")


def test_ring_channels_across_racks_keep_to_nccls_search_when_the_channel_cap_is_raised(monkeypatch):
    """NCCL's ring across racks stops at 16 channels because their 45.1 GB/s each cover the GPU's 721.8 GB/s of
    NVLink in its model, not at half the channel cap: raising the cap to 64 keeps them at 16 across racks."""
    monkeypatch.setattr(ring, "max_channels", lambda: 64)
    assert len({transfer.channel for transfer in crossings("all_reduce", "ring")}) == 16


def test_ring_over_racks_holding_one_tray_each_keeps_its_crossings_on_one_rail():
    """Members on one tray a rack (tray 1 of the first, tray 0 of the second) are matched by their index in the
    tray: by index in the rack (4-7 against 0-3) no crossing would join GPUs of one rail."""
    ranks = (*range(4, 8), *range(RACK, RACK + 4))
    local, domain = TWO_RACKS.gpu_local, TWO_RACKS.gpu_domain
    phases = plan_collective(CollectiveRequest("all_reduce", ranks, GIB), TWO_RACKS, "ring")
    across = [transfer for phase in phases for transfer in phase.transfers
              if domain[transfer.src] != domain[transfer.dst]]
    assert len({transfer.channel for transfer in across}) == 4
    assert all(local[transfer.src] == local[transfer.dst] for transfer in across)


def test_uneven_group_is_refused_by_host_where_a_racks_switches_are_down():
    """With all 9 NVSwitch trays of rack 0 down its trays are hosts again (`ring.group_by_domain`): a group of 4 GPUs on
    tray 0 and 1 on tray 1 is uneven by host, and refused so, not "on every NVLink domain", the rack holding all 5."""
    from simulator.config.faults import StepFaults
    from simulator.config.loader import scenario_from_text
    from simulator.engine.faults import FaultHooks
    from simulator.reliability.perturbed import with_step_faults
    from simulator.reliability.states import nvswitch_tray_faults
    from simulator.simulation import step_faults
    from simulator.topology.loader import scenario_topology

    loaded = scenario_from_text("cluster: {topology: gb200-nvl72, racks: 2, trays: 4, leaf_ports: 4, spines: 2}\n"
                                "workload: [{name: ar, op: all_reduce, bytes: 64 MiB, group: all}]\n", "ar.yaml")
    faults = StepFaults(links=nvswitch_tray_faults(scenario_topology(loaded), (("rack0/nvswitch", 9),)))
    topology = scenario_topology(loaded)
    FaultHooks(topology, step_faults(with_step_faults(loaded, faults), topology))
    with pytest.raises(ScenarioError) as info:
        plan_collective(CollectiveRequest("all_reduce", (0, 1, 2, 3, 4), GIB), topology, "hierarchical")
    assert info.value.problem.startswith("hierarchical all_reduce needs the same number of group members on every "
                                         "host, got 1, 4")


@pytest.mark.parametrize(("racks", "edges", "expected_ms"), [(2, 2, 2.7512), (4, 4, 5.4773)])
def test_nvls_tree_across_racks_binds_on_slow_nics_at_its_closed_form(racks, edges, expected_ms):
    """On 100 Gb/s NICs NCCL's tree over the racks' 32 heads outlasts the in-switch level: NCCL's NVLS tree
    latency, then the busiest head's tree edges (2 over 2 racks, one in each tree; 4 over 4, interior in one tree
    and a leaf in the other) of n/64 each way over its NIC. Every tray under one leaf group, at line rate. A pin
    of the tree where it binds (on 400 Gb/s NICs the in-switch level binds, as in the test above)."""
    topology = load_topology("gb200-nvl72", {"racks": racks, "nic_bandwidth": "100 Gb/s", "leaf_ports": 18 * racks})
    nic = 100e9 / 8
    tree = edges * GIB / 64 / nic
    assert tree > GIB * (RACK + 1) / RACK / nvls.in_switch_efficiency(topology) / NVLINK
    simulated = time_collective(topology, "all_reduce", "nvls", racks * RACK, GIB, efficiency=LINE_RATE)
    assert simulated == pytest.approx(nvls.tree_latency(racks) + tree, rel=1e-9)
    assert simulated * 1e3 == pytest.approx(expected_ms, abs=5e-5)
