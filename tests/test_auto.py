"""`auto` picks among the algorithms NCCL's tuner weighs, by estimates that agree with what the simulation of
those algorithms gives (collectives/tuner.py; docs/collectives.md, "The `auto` rule")."""

from __future__ import annotations

import pytest

from simulator.collectives.execute import time_collective
from simulator.collectives.phases import CollectiveRequest
from simulator.collectives.ring import group_by_host
from simulator.collectives.tuner import candidates, choose_algorithm, estimates
from simulator.network.calibration import calibrated
from simulator.topology.loader import load_topology

KIB, MIB, GIB = 2.0**10, 2.0**20, 2.0**30
CHUNK = 4 * MIB
SIZES = [KIB * 4**k for k in range(12)]  # 1 KiB .. 4 GiB
MARGIN = 1.01
"""auto's pick may be this much slower in simulation than the fastest candidate NCCL would weigh."""
ESTIMATE_FACTOR = 1.35
"""The estimate of the pick lies within this factor either way of its simulated time (estimates take nominal
link bandwidths, the simulation the calibrated efficiencies of the cluster's links)."""


def simulated(topology, request: CollectiveRequest, algorithm: str) -> float:
    return time_collective(topology, request.op, algorithm, list(request.ranks), request.nbytes,
                           efficiency=calibrated(topology.gpu_model), chunk_bytes=CHUNK)


@pytest.mark.parametrize("name", ["dgx-h100-cluster", "dgx-a100-cluster"])
@pytest.mark.parametrize("hosts", [1, 2, 4, 16])
def test_auto_is_the_fastest_nccl_candidate_and_its_estimate_holds(name, hosts):
    """On 16 DGX H100s auto took `hierarchical` (not an NCCL algorithm; 448 us at 1 MiB) over the tree (383 us),
    whose estimate was far from its simulation (1,808 against 253 us at 16 MiB on two hosts), and it never
    weighed NVLS across hosts (NCCL's NVLS tree, 197 us there)."""
    topology = load_topology(name, {"nodes": hosts})
    ops = ["all_reduce", "reduce_scatter", "all_gather"] if hosts == 1 else ["all_reduce"]
    for op in ops:
        for nbytes in SIZES:
            request = CollectiveRequest(op, tuple(range(topology.num_gpus)), nbytes, chunk_bytes=CHUNK)
            names = candidates(request, topology, group_by_host(request.ranks, topology))
            assert "hierarchical" not in names
            times = {algorithm: simulated(topology, request, algorithm) for algorithm in names}
            pick = choose_algorithm(request, topology)
            assert times[pick] <= MARGIN * min(times.values()), (op, nbytes, pick, times)
            estimate = estimates(request, topology)[pick]
            assert 1 / ESTIMATE_FACTOR <= estimate / times[pick] <= ESTIMATE_FACTOR, (op, nbytes, pick)


def test_tree_across_hosts_is_the_pick_for_small_messages_where_nccl_takes_it():
    """Between DGX A100s (no NVLink SHARP) the tree's few latency steps win small all-reduces and the ring's
    bandwidth the large ones, as in NCCL's tuner."""
    topology = load_topology("dgx-a100-cluster", {"nodes": 16})
    everyone = tuple(range(topology.num_gpus))
    assert choose_algorithm(CollectiveRequest("all_reduce", everyone, MIB, chunk_bytes=CHUNK), topology) == "tree"
    assert choose_algorithm(CollectiveRequest("all_reduce", everyone, GIB, chunk_bytes=CHUNK), topology) == "ring"


def test_one_gpu_per_host_weighs_the_flat_double_tree():
    topology = load_topology("dgx-a100-cluster", {"nodes": 16})
    rail = tuple(range(0, topology.num_gpus, 8))
    for nbytes in (KIB, MIB, GIB):
        request = CollectiveRequest("all_reduce", rail, nbytes, chunk_bytes=CHUNK)
        times = {algorithm: simulated(topology, request, algorithm) for algorithm in ("ring", "tree")}
        pick = choose_algorithm(request, topology)
        assert times[pick] <= MARGIN * min(times.values()), (nbytes, times)
        assert 1 / ESTIMATE_FACTOR <= estimates(request, topology)[pick] / times[pick] <= ESTIMATE_FACTOR


def test_nvls_tree_across_h100_hosts():
    """NCCL runs its NVLS tree across hosts whose switches reduce (without SHARP); auto did not weigh it."""
    topology = load_topology("dgx-h100-cluster", {"nodes": 4})
    request = CollectiveRequest("all_reduce", tuple(range(32)), 16 * MIB, chunk_bytes=CHUNK)
    assert choose_algorithm(request, topology) == "nvls"


@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
def test_nvls_inside_an_nvlink_domain_of_many_hosts(op):
    """A GB200 NVL72 rack is one NVLink domain over 18 hosts (trays): NVLS there was estimated as the NVLS tree
    across hosts (25 us + 2 x 5 x 20.9 us at 4 KiB, 9.4 times its simulated 25 us)."""
    topology = load_topology("gb200-nvl72", {})
    for nbytes in (4 * KIB, 16 * MIB, GIB):
        request = CollectiveRequest(op, tuple(range(topology.num_gpus)), nbytes, chunk_bytes=CHUNK)
        times = {algorithm: simulated(topology, request, algorithm) for algorithm in ("ring", "nvls")}
        pick = choose_algorithm(request, topology)
        assert times[pick] <= MARGIN * min(times.values()), (nbytes, times)
        assert 1 / ESTIMATE_FACTOR <= estimates(request, topology)["nvls"] / times["nvls"] <= ESTIMATE_FACTOR
    assert choose_algorithm(CollectiveRequest(op, tuple(range(72)), 4 * KIB), topology) == "nvls"


def test_the_nvls_tree_is_weighed_only_on_gpus_that_drive_nvlink_sharp():
    """Hosts whose switches reduce but whose GPUs (A100) cannot drive NVLS: auto weighed the NVLS tree across
    them and ended every all-reduce there in 'nvls needs GPUs with NVLink SHARP', which nobody had asked for."""
    node = {"kind": "nvswitch_node", "gpu_model": "a100-80gb", "nvls": "nvswitch3"}
    topology = load_topology("dgx-h100-cluster", {"nodes": 2, "node": node})
    request = CollectiveRequest("all_reduce", tuple(range(16)), 64 * MIB, chunk_bytes=CHUNK)
    assert choose_algorithm(request, topology) == "ring"
