"""Scenarios, constants and helpers that several test modules use, imported as `from shared import ...` (tests/ is
on the path when pytest runs; there is no tests package). A test module imports these from here, never from another
test module."""

from __future__ import annotations

import copy
import functools
import json
import math
import shutil
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from simulator import load_scenario, simulate, simulation
from simulator.collectives.execute import time_collective
from simulator.collectives.names import POINT_TO_POINT
from simulator.config.loader import scenario_from_text
from simulator.reliability.simulate import healthy_step_activity
from simulator.simulation import Result, network_settings
from simulator.sweep.layouts import SPACE_FLAGS
from simulator.topology.graph import Topology, Wiring, add_link
from simulator.topology.loader import scenario_topology

RAILS = """
cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2}
model: {layers: 4, hidden: 4096, heads: 32, vocab: 32000}
training: {seq_len: 1024, microbatches: 1}
parallelism: {tp: 8, dp: 4}
checkpoint: {interval: 30 min}
storage: {capacity: 1 PB}
"""
"""Four DGX hosts in two leaf groups of two (eight rails, two spines), a replica per host: a rotation by two
replicas moves leaf group 0 onto leaf group 1."""

ONE_GPU_HOSTS = """
cluster: {topology: dgx-h100-cluster, nodes: 4, node: {kind: nvswitch_node, gpus: 1}, nics_per_node: 1,
          leaf_ports: 2, spines: 2, oversubscription: 2}
model: {layers: 2, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 1}
parallelism: {dp: 4}
checkpoint: {interval: 1000 d}
storage: {capacity: 1 PB}
"""
"""Four hosts of one GPU each under two leaves (two spines, oversubscribed 2:1), a replica a host."""

LLAMA3_8B_ON_4_HOSTS = """
cluster: {topology: dgx-h100-cluster, nodes: 4}
model: {preset: llama3-8b}
training: {seq_len: 2048, global_batch: 16}
parallelism: {tp: 8, dp: 4}
"""
"""The step of the jobs with an in-memory tier (test_reliability_memory_tier.py, test_reliability_two_level.py):
32 GPUs, a replica a host."""

DP_INNERMOST_DGX = """cluster: {topology: dgx-h100-cluster, nodes: 4}
model: {layers: 8, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {pp: 4, dp: 4, order: [dp, tp, cp, pp]}
checkpoint: {interval: 30 min}
storage: {capacity: 1 PB}
run: {horizon: 1 d}
faults: {components: {gpu: {mtbf: 30 d, repair: 2 h}}}
restart: {elastic: true}
"""
"""An elastic job on 4 DGX hosts, DP innermost (order [dp, tp, cp, pp]), a host per pipeline stage: with TP 2
each of the full job's TP groups (ranks r, r + 4) stays in a host, and the job shrunk to 3 replicas puts one
across two hosts (test_elastic_nvl72.py writes the TP into the file, test_reliability_states.py sets it)."""


TWO_REPLICAS_PER_RACK = """
cluster: {topology: gb200-nvl72, racks: 2, trays: 4}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 2048, global_batch: 16, micro_batch: 1, precision: bf16, recompute: none}
parallelism: {tp: 4, pp: 2, dp: 4, order: [tp, cp, pp, dp], sequence_parallel: true, tp_comm_overlap: true,
              pipeline: {schedule: interleaved, virtual_stages: 2}, zero: 1}
run: {timeline: summary}
"""
"""Two GB200 racks of 4 trays, TP 4 in a tray, PP 2 (interleaved), DP 4: two replicas a rack (tests/test_folding.py,
and with 16 trays and TP 8 tests/test_scale.py)."""

GB200_JOB_FOUR_LAYERS = ("run.horizon=null", "model.layers=4")
"""The bundled GB200 job's step cut to 4 layers on the same cluster and layout (two a stage of its PP 2), as a step:
the wait test (test_bottleneck.py) and the tray-class estimate (test_scale.py) read the one run."""


HEALTHY_STEP = healthy_step_activity(0).split("(")[0]
"""The start of every healthy-step line, whatever the cluster's GPUs."""


def after_the_healthy_step(heard: list) -> list:
    """What a job's ``activity`` heard, less the line naming its healthy step while it is simulated
    (`reliability.simulate.healthy_step_activity`, tested on its own in test_reliability_job) and the blank that
    clears it: the later phases' lines, as the tests of those phases read them. Entries other than text (a test's
    own markers) are kept and pass the blank through."""
    kept: list = []
    after_healthy = False
    for entry in heard:
        if isinstance(entry, str) and entry.startswith(HEALTHY_STEP):
            after_healthy = True
            continue
        if entry == "" and after_healthy:
            after_healthy = False
            continue
        if isinstance(entry, str):
            after_healthy = False
        kept.append(entry)
    return kept


def bundled_result(name: str, overrides: tuple[str, ...] = ()) -> Result:
    """A bundled scenario's run with ``overrides``, once per session: the tests that read the same run share it,
    and none changes it."""
    return _bundled_run(name, overrides)


@functools.cache
def _bundled_run(name: str, overrides: tuple[str, ...]) -> Result:
    """`bundled_result`'s cache, keyed the same whether or not a caller names the empty overrides."""
    return simulate(load_scenario(name, list(overrides)))


def _figures(summary: dict, path: str = "") -> dict[str, object]:
    """Every leaf of ``summary`` by its path, the fold's own entries (the folds given up, the ranks' weights among them)
    left out."""
    if isinstance(summary, dict):
        return {key: value for name, entry in summary.items()
                if name not in ("folded", "simulated_ranks", "ops_executed", "flows_simulated", "fold_given_up",
                                "rank_weights")
                for key, value in _figures(entry, f"{path}.{name}").items()}
    return {path: summary}


def assert_same_figures(folded: dict, unfolded: dict, rel: float, absolute: float, reason: str = "") -> None:
    """Every figure of the folded summary equals the unfolded one's (floats within ``rel`` / ``absolute``), the
    folded run's ``reason`` entry (why it refolded) its only extra; of a link tier's busiest link its bytes and
    utilisation over the step, not its name nor its utilisation while it is busy: among links carrying the same
    bytes the fold's mirrors may load another than the unfolded run names, whose busy time may differ by the
    microseconds its flows end apart (docs/performance.md: a tree edge's flows end up to 0.6 us apart between hosts
    of one place)."""
    ours, theirs = _figures(folded), _figures(unfolded)
    assert ours.keys() - ({f".{reason}"} if reason else set()) == theirs.keys()
    for path, value in theirs.items():
        if ".link_tiers.tiers." in path and path.endswith((".busiest_link", ".utilisation_in_transfers")):
            continue
        if isinstance(value, float):
            assert math.isclose(ours[path], value, rel_tol=rel, abs_tol=absolute), path
        else:
            assert ours[path] == value, path


KIB, MIB, GIB = 2**10, 2**20, 2**30
ALPHA, BANDWIDTH = 5e-6, 50e9
"""The latency (s) and bandwidth (B/s) of `switch_topology`'s links by default."""


def switch_topology(size: int, bandwidth: float = BANDWIDTH, alpha: float = ALPHA) -> Topology:
    """A non-blocking switch: each GPU one link (bandwidth B, latency a/2), so GPU-to-GPU costs a + n/B."""
    graph = Wiring()
    gpus = [f"gpu{i}" for i in range(size)]
    for gpu in gpus:
        add_link(graph, gpu, "switch", bandwidth=bandwidth, latency=alpha / 2, link_class="nvlink")
    return Topology("switch", graph, gpus, gpu_host=[0] * size, gpu_local=list(range(size)))


def two_level_topology(hosts: int, per_host: int, *, b_in: float, a_in: float, b_out: float,
                       a_out: float) -> Topology:
    """g GPUs per host on a host switch, plus one NIC per GPU to the rail switch of its local index."""
    graph = Wiring()
    gpus, gpu_host, gpu_local = [], [], []
    for host in range(hosts):
        for local in range(per_host):
            gpu = f"h{host}g{local}"
            gpus.append(gpu)
            gpu_host.append(host)
            gpu_local.append(local)
            add_link(graph, gpu, f"host{host}", bandwidth=b_in, latency=a_in / 2, link_class="nvlink")
            add_link(graph, gpu, f"rail{local}", bandwidth=b_out, latency=a_out / 2, link_class="infiniband")
    return Topology("two-level", graph, gpus, gpu_host=gpu_host, gpu_local=gpu_local, rails=per_host)


COMM_SCENARIO = {
    "description": "collectives on two DGX H100 nodes",
    "cluster": {"topology": "dgx-h100-cluster", "nodes": 2},
    "network": {"model": "flow", "efficiency": "calibrated"},
    "collectives": {"algorithm": "auto", "chunk": "4 MiB", "channels": 0},
    "run": {"seed": 7},
    "workload": [
        {"name": "dp", "op": "all_reduce", "bytes": "64 MiB", "group": "all", "algorithm": "ring"},
        {"name": "tp", "op": "all_reduce", "bytes": "8 MiB", "group": "0-7", "after": ["dp"], "repeat": 2},
        {"name": "bc", "op": "broadcast", "bytes": "1 MiB", "group": [0, 8, 9], "root": 1},
        {"name": "p2p", "op": "send_recv", "bytes": "16 MiB", "src": 0, "dst": 8, "stream": "p2p"},
    ],
}


TRAINING_SCENARIO = {
    "cluster": {"topology": "dgx-h100"},
    "network": {"efficiency": {"nvlink": 0.8}},
    "model": {"synthetic": {"stages": 2, "forward": "1 ms", "backward": "2 ms", "p2p_bytes": "16 MiB"}},
    "training": {"seq_len": 2048, "microbatches": 4, "precision": "bf16"},
    "parallelism": {"tp": 1, "pp": 2, "dp": 4, "order": ["tp", "cp", "pp", "dp"],
                    "pipeline": {"schedule": "1f1b", "virtual_stages": 1}, "ddp": {"bucket": "25 MiB"}},
}


CLUSTER_TOPOLOGY = {
    "nodes": 2,
    "node": {"kind": "nvswitch_node", "gpus": 4, "nvlink_bandwidth": "450 GB/s", "nvlink_latency": "3.4 us"},
    "nics_per_node": 4,
    "nic_bandwidth": "400 Gb/s",
    "nic_pcie_bandwidth": "64 GB/s",
    "nic_latency": "6.5 us",
    "switch_latency": "0.5 us",
    "link_class": "infiniband",
    "leaf_ports": 32,
    "spines": 4,
    "oversubscription": "2:1",
    "tiers": 2,
}


BAD_VALUES = [
    None, True, False, 0, -1, -3, 1, 2, 3, 1.5, -0.5, 0.0, float("nan"), float("inf"), "", " ", "abc", "0",
    "-1", "1e400", "1e400 GB", "1e300 GiB", "1e300 GB/s", "-5 GB", "-1 us", "0 B", "0 GB/s", "0 s", "5 parsecs",
    "12 GiB/s", "400 Gb", "3.4 us/s", "nan GB", "inf s", "1,5 GB", "GB", "0x10 B", "all", "0-99", "7-3", "3-",
    [], [0], [0, 0], [-1, 2], ["a"], {}, {"x": 1}, {"kind": "gpu"}, [{"a": 1}], "h100-sxm", "bogus-kind",
]


NEW_KEYS = ["nodes", "kind", "bytse", "netwrok", "extra", "topology", "group", "bandwidth", "0", "name"]


def container_paths(node: object, path: tuple = ()) -> list[tuple]:
    """Paths of every mapping and list inside ``node`` (itself included), in a fixed order."""
    found = [path]
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        if isinstance(child, (dict, list)):
            found.extend(container_paths(child, path + (key,)))
    return found


def node_at(node: object, path: tuple) -> object:
    """The mapping or list at ``path`` inside ``node``."""
    for part in path:
        node = node[part]
    return node


@st.composite
def mutated(draw, base: dict) -> dict:
    """A deep copy of ``base`` with one to three random edits: delete, rename, retype or add a key/item."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        container = node_at(data, draw(st.sampled_from(container_paths(data))))
        keys = list(container) if isinstance(container, dict) else list(range(len(container)))
        action = draw(st.sampled_from(["delete", "rename", "replace", "replace", "add"]))
        value = copy.deepcopy(draw(st.one_of(st.sampled_from(BAD_VALUES), st.text(max_size=12),
                                             st.integers(-10**6, 10**3), st.floats(allow_nan=True))))
        if action == "add" or not keys:
            if isinstance(container, dict):
                container[draw(st.sampled_from(NEW_KEYS))] = value
            else:
                container.append(value)
            continue
        key = draw(st.sampled_from(keys))
        if action == "delete":
            del container[key]
        elif action == "rename" and isinstance(container, dict):
            container[draw(st.sampled_from(NEW_KEYS)) + "x"] = container.pop(key)
        else:
            container[key] = value
    return data


CP_FABRIC = """
cluster: {topology: dgx-h100-cluster, nodes: 8, leaf_ports: 2, spines: 2, oversubscription: 2}
model: {layers: 8, hidden: 2048, heads: 16, kv_heads: 4, vocab: 32000}
training: {seq_len: 16384, microbatches: 4, precision: bf16}
parallelism: {tp: 4, cp: 4, pp: 2, dp: 2, order: [tp, cp, pp, dp], sequence_parallel: true,
              cp_algorithm: all_gather}
collectives: {algorithm: ring}
"""
"""Eight DGX hosts, two per leaf, 2:1 spines: TP 4 x CP 4 (all-gather K/V) x PP 2 x DP 2, ring collectives."""


DP_FABRIC = """
cluster: {topology: dgx-h100-cluster, nodes: 32, leaf_ports: 2}
model: {preset: llama3-8b, layers: 8}
training: {seq_len: 2048, global_batch: 64, micro_batch: 1}
parallelism: {tp: 4, pp: 4, dp: 16, sequence_parallel: true, zero: 1}
"""
"""32 DGX hosts, two per leaf: TP 4 x PP 4 x DP 16 of an 8-layer Llama 3 8B under ZeRO-1."""


THREE_TIERS = """
cluster: {topology: dgx-h100-cluster, nodes: 8, leaf_ports: 1, tiers: 3, pods: 2, spines: 2, oversubscription: 2}
model: {preset: llama3-8b, layers: 4}
training: {seq_len: 2048, global_batch: 32, micro_batch: 1}
parallelism: {tp: 8, pp: 2, dp: 4, sequence_parallel: true, zero: 1}
collectives: {algorithm: ring}
"""
"""Eight DGX hosts, one per leaf, in two pods of a three-tier fabric at 2:1: TP 8 x PP 2 x DP 4."""


CP_FABRIC_TEMPLATE = """
cluster: {topology: dgx-h100-cluster, spines: 2, oversubscription: 2}
model: {layers: 8, hidden: 2048, heads: 16, kv_heads: 4, vocab: 32000}
training: {seq_len: 16384, microbatches: 4, precision: bf16}
parallelism: {order: [tp, cp, pp, dp], sequence_parallel: true}
"""
"""A CP model on DGX hosts under 2:1 spines; hosts, leaf ports and layout given by `--set` overrides."""


NO_REFOLDS = "too large to refold"
"""What a budget that refuses every refold says (`RefoldBudget`)."""


def refused_unfolded(text: str, refolds: bool = False) -> dict:
    """The summary of ``text`` run with a guard that refuses every unfolding (a step too large unfolded), and a
    refold budget that refuses every refold, or with ``refolds`` allows each."""
    from simulator.engine.faults import FaultHooks
    from simulator.errors import ScenarioError
    from simulator.simulation import simulate_training, step_faults

    loaded = scenario_from_text(text, "inline.yaml", [])
    topology = scenario_topology(loaded)

    def refuse(unfolding):
        raise ScenarioError(f"too large unfolded: {unfolding.reason}")

    return simulate_training(loaded, topology, FaultHooks(topology, step_faults(loaded, topology)),
                             guard=refuse,
                             budget=lambda ranks: "" if refolds else NO_REFOLDS).summary


FABRIC_HAND_OFFS = """
cluster: {topology: dgx-h100-cluster, nodes: 6, leaf_ports: 2, spines: 2}
model: {layers: 12, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 2048, microbatches: 4}
run: {timeline: summary}
parallelism: {tp: 8, pp: 3, dp: 2}
"""
"""Six DGX hosts, two per leaf, two spines: TP 8 x PP 3 x DP 2, its pipeline hand-offs between hosts."""


def step_program_and_plans(text: str):
    """The folded step program of ``text``, its collective plan cache, and a maker of fresh plan caches."""
    loaded = scenario_from_text(text, "inline.yaml", [])
    topology = scenario_topology(loaded)
    program = simulation.step_program(loaded, topology, fold=True)
    settings = simulation.network_settings(loaded, topology)
    return program, simulation.plan_cache(topology, settings), lambda: simulation.plan_cache(topology, settings)


SHARED_NICS = """
cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2, oversubscription: 2, nics_per_node: 4}
collectives: {channels: 2}
model: {layers: 12, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {tp: 8, pp: 2, dp: 2}
"""
"""tests/test_folding.py's lanes sharing a NIC whose DP rings meet the uplinks unevenly: folding is not exact."""


ALTERNATING = """
cluster: {topology: dgx-h100-cluster, nodes: 4}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000,
        moe: {experts: 16, top_k: 2, routing: {balance: dirichlet, skew: 0.2}}}
training: {seq_len: 1024, microbatches: 4, recompute: full}
parallelism: {tp: 1, dp: 32, ep: 8, zero: 1}
"""
"""Four DGX hosts, DP 32 x EP 8 of a skewed MoE: its ranks fall in two classes by the direction of the ring
through their host (test_rank_classes.py's BY_HOST_PARITY)."""


WRAP_ON_UNLIKE_SPINES = """
cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 1, spines: 2, oversubscription: 2}
model: {layers: 16, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 4096, microbatches: 8, precision: bf16}
parallelism: {tp: 8, pp: 2, dp: 2, order: [tp, cp, dp, pp], pipeline: {schedule: interleaved, virtual_stages: 2}}
"""
"""Four DGX H100, one per leaf group, two spines at 2:1; TP 8 on each host, stage 0 on hosts 0 and 1 (the two DP
replicas), stage 1 on hosts 2 and 3, interleaved with two chunks per rank, so stage 0 hands its chunk 1's
gradients back to stage 1 (the wrap) over the spines while the stage's DP ring crosses them too."""


CROSS_RAIL_PP = """
cluster: {topology: dgx-h100-cluster, nodes: 8, leaf_ports: 4, spines: 3, oversubscription: 3}
collectives: {channels: 2, protocol: simple}
model: {layers: 12, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {tp: 4, pp: 4, dp: 4}
"""
"""Eight DGX hosts, TP 4 x PP 4 x DP 4, cross-rail PP pairs over 3:1 spine links: each of a stage's four DP replicas
is a TP group of four GPUs on its own host (stage 0 on hosts 0, 2, 4 and 6); the stage fold's run falls out of step
at a hand-off and the step runs again by route class (tests/test_cli.py, tests/test_rank_classes.py)."""


THREE_SIGMA_IN_HALF_WIDTHS = 3 / 1.96


def inside(value: float, interval: dict, widest: float) -> bool:
    """``value`` within 3 standard errors (1.53 half-widths) of the simulated mean, whose 95% interval is no
    wider than ``widest`` either side."""
    half = (interval["ci95_high"] - interval["ci95_low"]) / 2
    return half <= widest and abs(value - interval["mean"]) <= THREE_SIGMA_IN_HALF_WIDTHS * half


def renewal_ettr(interval: float, restart: float, shape: float = 1.0, *, cost: float, mtbf: float) -> float:
    """Exact ETTR of a job checkpointing every ``interval`` of work at ``cost`` that one renewal process of
    failures (Weibull of the given shape with mean ``mtbf``) interrupts, each failure costing ``restart``
    (tests/test_reliability_study.py's module docstring); for exponential failures the sum is Daly's closed form
    T e^(-R/M) / (M (e^((T+C)/M) - 1))."""
    scale = mtbf / math.gamma(1 + 1 / shape)
    starts = restart + np.arange(1, 100_000) * (interval + cost)
    return interval * float(np.exp(-(starts / scale) ** shape).sum()) / mtbf


SPARE_JOB = """cluster:
  topology: dgx-h100-cluster
  nodes: 2
model:
  preset: llama3-8b
training:
  seq_len: 1024
  global_batch: 16
parallelism:
  tp: 8
run:
  horizon: 2 d
faults:
  components:
    gpu:
      mtbf: 1000 h
      repair: 4 h
checkpoint:
  interval: 30 min
storage:
  capacity: 1 PB
restart:
  spares: 1
"""
"""Two DGX hosts training Llama 3 8B with GPU failures and one spare host."""


ZERO3_JOB = ONE_GPU_HOSTS.replace(
    "layers: 2, hidden: 2048, heads: 16", "layers: 6, hidden: 12288, heads: 96").replace(
    "parallelism: {dp: 4}", "parallelism: {dp: 4, zero: 3}").replace(
    "microbatches: 1}", "microbatches: 1, grad_reduce_dtype: fp32}") + """\
run: {horizon: 2 d, replications: 1, seed: 5}
restart: {elastic: true}
faults: {components: {gpu: {mtbf: 2 d, repair: 6 h}}}
"""
"""An elastic job of ONE_GPU_HOSTS under ZeRO-3 (6 layers 12288 wide), gradients reduced in fp32 (DeepSpeed's
`communication_data_type: fp32`; bf16 by default), for the 18 B per parameter its tests count."""


REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"
DATA = REPO / "tests" / "data"
GB = 1e9
KINETO_2RANK = SCENARIOS / "traces" / "allreduce-2rank"
ALLREDUCE_BYTES = 16777216 * 2  # 16 Mi bf16 elements, as the trace's record_param_comms says
EXACT = 1e-9
"""Relative tolerance for figures that must agree exactly (float rounding only)."""


def run(text: str, folder: Path):
    """Simulate a scenario written into ``folder`` (trace paths are relative to it)."""
    path = folder / "scenario.yaml"
    path.write_text(text)
    loaded = scenario_from_text(text, source=str(path))
    return loaded, simulate(loaded)


def two_rank_scenario(nic: str, *, dp: str = "", nodes: int = 2, extra: str = "") -> str:
    """The bundled two-rank Kineto traces on single-GPU ethernet-100g hosts with NICs of ``nic``."""
    return (f"cluster: {{topology: ethernet-100g, nodes: {nodes}, nic_bandwidth: {nic}}}\n"
            f"collectives: {{algorithm: ring}}\n{extra}"
            f"workload: {{trace: '{KINETO_2RANK}/rank*.json', format: kineto{dp}}}\n")


def allreduce_time(loaded, nbytes: float, ranks: int, op: str = "all_reduce") -> float:
    """``op``'s time over the first ``ranks`` GPUs of the scenario's cluster on an idle network (a point-to-point
    op under `auto`: the run-wide `collectives.algorithm` does not apply to it, as in the run)."""
    topology = scenario_topology(loaded)
    settings = network_settings(loaded, topology)
    algorithm = "auto" if op in POINT_TO_POINT else settings.algorithm
    return time_collective(topology, op, algorithm, ranks, nbytes,
                           efficiency=dict(settings.efficiency), chunk_bytes=settings.chunk_bytes,
                           channels=settings.channels)


def transfer_s(nic_bit_rate: float, nbytes: float = ALLREDUCE_BYTES) -> float:
    """The closed form of a transfer of ``nbytes`` (by default the traces' 32 MiB) between the two single-GPU
    hosts of ethernet-100g (topologies/ethernet-100g.yaml) with NICs of ``nic_bit_rate`` (bits/s): the path's
    latency, 7 us per NIC through the one switch, plus the bytes over the Ethernet link's rate at the calibrated
    Ethernet efficiency, 0.94 (the GPU's 32 GB/s PCIe to its NIC, at 0.8 of it, is faster)."""
    return 2 * 7e-6 + nbytes / (nic_bit_rate / 8 * 0.94)


def chakra_step(folder: Path, rank: int, groups: list[dict] | None, pg_name: str = "1", gemm_us: int = 1000) -> None:
    """A Chakra trace of one rank (a JSON array of nodes): PyTorch's process-group metadata node as Chakra's
    converter keeps it (the JSON of pg_config_info inside the Python text of `inputs.values`), a GEMM, a 64 MiB
    all-reduce of group ``pg_name``, 100 us after it."""
    inputs = {"values": str([json.dumps(groups)]), "shapes": "[[]]", "types": "['String']"}
    nodes = [{"id": 1, "name": "## process_group:init ##", "type": "METADATA_NODE", "inputs": inputs}] if groups else []
    nodes += [{"id": 2, "name": "gemm", "type": "COMP_NODE", "durationMicros": gemm_us},
              {"id": 3, "name": "all_reduce", "type": "COMM_COLL_NODE", "dataDeps": [2],
               "attr": [{"name": "comm_type", "int64Val": 0}, {"name": "comm_size", "int64Val": 64 * 2**20},
                        {"name": "pg_name", "stringVal": pg_name}]},
              {"id": 4, "name": "after", "type": "COMP_NODE", "dataDeps": [3], "durationMicros": 100}]
    (folder / f"rank{rank}.json").write_text(json.dumps(nodes))


MESH = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "ranks": [], "group_size": 2},
        {"pg_name": "1", "pg_desc": "mesh_tp", "backend_config": "cuda:nccl", "ranks": [0, 1], "group_size": 2}]


def chakra_scenario(folder: Path, cluster: str = "{topology: dgx-h100}", algorithm: str = "ring",
                    protocol: str = "auto") -> str:
    """The scenario of the Chakra traces ``folder/rank*.json`` on ``cluster``."""
    return (f"cluster: {cluster}\ncollectives: {{algorithm: {algorithm}, protocol: {protocol}}}\n"
            f"workload: {{trace: '{folder}/rank*.json', format: chakra-json}}\n")


def cpu_only_profile(folder: Path) -> Path:
    """A Kineto profile with no GPU activity written in ``folder``, its path: aten::linear 2 ms and aten::relu
    0.5 ms on thread 1, aten::linear 4 ms on thread 2, in a 5 ms ProfilerStep."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0,
               "dur": 5000}]
    events += [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
               for name, tid, ts, dur in (("aten::linear", 1, 100, 2000), ("aten::relu", 1, 2200, 500),
                                          ("aten::linear", 2, 0, 4000))]
    path = folder / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def copy_traces(source: Path, folder: Path) -> Path:
    """A copy of the traces in ``source`` under ``folder``, for a test to edit."""
    target = folder / "traces"
    shutil.copytree(source, target)
    return target


def launched(kind: str, group: str, place: int | None, first_id: int, deps: list[int]) -> list[dict]:
    """A send or receive of 32 MiB in process group ``group`` as Chakra's converter writes it from a PyTorch
    execution trace: no comm_dst / comm_src, and (``place`` not None) the record_param_comms CPU op that launched
    it, kept as a node of its own and the GPU node's control dependency, its inputs the text of PyTorch's
    RECORD_PARAM_COMMS_DATA list (input tensors, (seq, is-p2p), (group name, description), the peer's rank in the
    group, the name, split sizes, global rank start and stride, the group's size)."""
    node = {"id": first_id + 1, "name": "ncclDevKernel_SendRecv", "type": f"COMM_{kind.upper()}_NODE",
            "dataDeps": deps, "attr": [{"name": "comm_size", "int64Val": ALLREDUCE_BYTES},
                                       {"name": "pg_name", "stringVal": group},
                                       {"name": "is_cpu_op", "boolVal": False}]}
    if place is None:
        return [node]
    values = [[[7, 8, 0, ALLREDUCE_BYTES // 2, 2, "cuda:0"]], [12, True], [group, "undefined"], place, kind, [], [],
              0, 1, 3]
    launcher = {"id": first_id, "name": "record_param_comms", "type": "COMP_NODE", "dataDeps": deps,
                "inputs": {"values": str(values), "shapes": "[]", "types": "[]"},
                "attr": [{"name": "is_cpu_op", "boolVal": True}]}
    return [launcher, {**node, "ctrlDeps": [first_id], "dataDeps": [first_id]}]


PIPELINE_GROUPS = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [], "group_size": 4},
                   {"pg_name": "2", "pg_desc": "undefined", "ranks": [1, 2, 3], "group_size": 3},
                   {"pg_name": "3", "pg_desc": "undefined", "ranks": [0, 1], "group_size": 2}]
"""A 4-rank job's process groups as PyTorch's execution-trace observer records them: the default group, a
pipeline group of ranks 1-3 and a two-rank pipeline group of ranks 0 and 1."""


def p2p_job(folder: Path, ranks: dict[int, list[dict]]) -> str:
    """Chakra traces of ranks 0-3 of the job of PIPELINE_GROUPS (``ranks``: each rank's nodes after the
    process-group metadata, node 1), on four single-GPU hosts of 25 Gb/s Ethernet; returns the scenario."""
    meta = {"id": 1, "name": "## process_group:init ##", "type": "METADATA_NODE",
            "inputs": {"values": str([json.dumps(PIPELINE_GROUPS)])}}
    for rank, nodes in ranks.items():
        (folder / f"rank{rank}.json").write_text(json.dumps([meta, *nodes]))
    return (f"cluster: {{topology: ethernet-100g, nodes: 4, nic_bandwidth: 25 Gb/s}}\n"
            f"workload: {{trace: '{folder}/rank*.json', format: chakra-json}}\n")


def p2p_node(node_id: int, kind: str, peer: int, nbytes: int, *, tag: int | None = None, group: str | None = None,
             deps: tuple[int, ...] = ()) -> dict:
    """A Chakra send (receive) of ``nbytes`` to (from) ``peer``, with its ``comm_tag`` and ``pg_name`` where
    given, after the nodes ``deps`` (control dependencies)."""
    attrs = [{"name": "comm_size", "int64Val": nbytes},
             {"name": "comm_dst" if kind == "send" else "comm_src", "int32Val": peer}]
    attrs += [{"name": "comm_tag", "int64Val": tag}] if tag is not None else []
    attrs += [{"name": "pg_name", "stringVal": group}] if group is not None else []
    return {"id": node_id, "name": f"{kind} {node_id}", "type": f"COMM_{kind.upper()}_NODE", "attr": attrs,
            "ctrlDeps": list(deps)}


def two_host_chakra_job(folder: Path, ranks: dict[int, list[dict]], traced_pp: int | None = None) -> str:
    """Chakra traces of ``ranks`` (each rank's nodes) on the two single-GPU hosts of 25 Gb/s Ethernet, with the
    traced job's stages declared where ``traced_pp`` gives them (else read off its transfers, with a warning)."""
    for rank, nodes in ranks.items():
        (folder / f"rank{rank}.json").write_text(json.dumps(nodes))
    declared = f", traced_pp: {traced_pp}" if traced_pp is not None else ""
    return (f"cluster: {{topology: ethernet-100g, nodes: 2, nic_bandwidth: 25 Gb/s}}\n"
            f"workload: {{trace: '{folder}/rank*.json', format: chakra-json{declared}}}\n")


def comms_args(folder: Path, rank: int, world: int | None = None, **args) -> None:
    """Set the record_param_comms args of the bundled trace's all-reduce (event 4) of ``rank``; None removes one.
    ``world``: the job's size that distributedInfo states instead of 2, for a group of more ranks."""
    path = folder / f"rank{rank}.json"
    doc = json.loads(path.read_text())
    if world is not None:
        doc["distributedInfo"]["world_size"] = world
    doc["traceEvents"][4]["args"].update(args)
    doc["traceEvents"][4]["args"] = {key: value for key, value in doc["traceEvents"][4]["args"].items()
                                     if value is not None}
    path.write_text(json.dumps(doc))


SEQ_2RANK = DATA / "traces" / "seq-2rank"


def seq_args(folder: Path, rank: int, index: int, **changes) -> None:
    """Change (None: remove) the collective args of kernel ``index`` of ``rank``'s trace in ``folder``."""
    path = folder / f"rank{rank}.json"
    doc = json.loads(path.read_text())
    args = doc["traceEvents"][index]["args"]
    args.update(changes)
    for name in [name for name, value in changes.items() if value is None]:
        del args[name]
    path.write_text(json.dumps(doc))


CHAKRA_COMM_TYPES = {"all_reduce": 0, "all_gather": 2, "all_to_all": 6, "reduce_scatter": 7}
"""Chakra's CollectiveCommType codes of the collectives chakra_job writes."""


def chakra_job(folder: Path, groups: dict[str, list[int]], work: dict[int, list[tuple]],
               named: dict[str, tuple[str, list[int]]] | None = None) -> None:
    """Chakra traces of ``work``'s ranks: PyTorch's process-group metadata (``groups``, each described "undefined",
    as torch.distributed describes a group created without a description, and the ``named`` ones: name ->
    (description, ranks)), then each rank's ops in a chain: ("all_reduce", group, bytes) (or another of
    CHAKRA_COMM_TYPES), ("send", peer, bytes)
    or ("recv", peer, bytes), a send or receive with its group's name as a fourth item where it has one."""
    described = {name: ("undefined", ranks) for name, ranks in groups.items()} | (named or {})
    meta = [{"pg_name": name, "pg_desc": desc, "ranks": ranks, "group_size": len(ranks)}
            for name, (desc, ranks) in described.items()]
    for rank, ops in work.items():
        nodes = [{"id": 1, "name": "## process_group:init ##", "type": "METADATA_NODE",
                  "inputs": {"values": str([json.dumps(meta)])}}]
        for number, (kind, target, nbytes, *pg_name) in enumerate(ops, start=2):
            attrs = [{"name": "comm_size", "int64Val": nbytes}, *({"name": "pg_name", "stringVal": name}
                                                                  for name in pg_name)]
            if kind in CHAKRA_COMM_TYPES:
                code = CHAKRA_COMM_TYPES[kind]
                node_type, attrs = "COMM_COLL_NODE", [*attrs, {"name": "comm_type", "int64Val": code},
                                                      {"name": "pg_name", "stringVal": target}]
            else:
                peer = "comm_dst" if kind == "send" else "comm_src"
                node_type, attrs = f"COMM_{kind.upper()}_NODE", [*attrs, {"name": peer, "int32Val": target}]
            nodes.append({"id": number, "name": kind, "type": node_type, "ctrlDeps": [number - 1] if number > 2 else [],
                          "attr": attrs})
        (folder / f"rank{rank}.json").write_text(json.dumps(nodes))


def all_to_all_2rank(folder: Path, splits: dict[int, tuple[str, str]]) -> str:
    """The scenario of seq-2rank with its first collective an all-to-all of group '5' (ranks [0, 1], described
    'undefined', as PyTorch describes a group made without one) of 4 Mi bf16 elements (8 MiB) in per rank, rank r
    splitting them as ``splits[r]`` says (PyTorch's `In split size`, `Out split size`: elements to and from each
    member); the second stays the default group's 16 MiB all-reduce. NCCL's algorithm choice (`auto`): a ring
    does not run all-to-alls."""
    traces = copy_traces(SEQ_2RANK, folder)
    for rank in (0, 1):
        seq_args(traces, rank, 1, **{"Collective name": "all_to_allv", "Process Group Name": "5",
                                     "Process Group Description": "undefined", "Process Group Ranks": "[0, 1]",
                                     "In split size": splits[rank][0], "Out split size": splits[rank][1], "Seq": 1})
    return two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)).replace("{algorithm: ring}",
                                                                                         "{algorithm: auto}")


EVEN = {0: ("[]", "[]"), 1: ("[]", "[]")}
"""Both ranks of all_to_all_2rank split their elements evenly (no split sizes)."""
UNEVEN = {0: ("[1048576, 3145728]", "[1048576, 1048576]"), 1: ("[1048576, 3145728]", "[3145728, 3145728]")}
"""Rank 0 sends 3 Mi elements (6 MiB) to rank 1, rank 1 1 Mi (2 MiB) to rank 0; each keeps the rest."""


STEP_ONLY = "run.horizon=null"
"""The `--set` that leaves a job scenario's step: `simulate()` of a job scenario runs its step too, but warns that it
ignores the job (simulator/simulation.py `one_step_of_a_job`); a test that wants the step says so."""


H = 3600.0
"""An hour in seconds, for job event times."""


def gb200_job(components: str, elastic: bool = True) -> str:
    """TP 4 x DP 8 on 2 GB200 racks of 4 trays (16 GPUs each), a replica per tray, no spares."""
    return f"""cluster: {{topology: gb200-nvl72, racks: 2, trays: 4, leaf_ports: 4, spines: 2}}
model: {{layers: 4, hidden: 2048, heads: 16, vocab: 32000}}
training: {{seq_len: 1024, microbatches: 2}}
parallelism: {{tp: 4, dp: 8}}
checkpoint: {{interval: 30 min}}
storage: {{capacity: 1 PB}}
run: {{horizon: 12 h}}
faults: {{components: {{{components}}}}}
restart: {{detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0, elastic: {str(elastic).lower()}}}
"""


THROTTLE_CLASSES = ("nvswitch_tray: {mtbf: 1000 d, repair: 2 h}, "
                    "throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 1000 d, repair: 2 h}")
"""An NVSwitch tray class and a x1.5 throttle class, each rare enough to leave a test's own events alone."""


OOM_JOB = """
cluster: {topology: dgx-h100-cluster}
model: {preset: llama3-70b, layers: 48}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1}
parallelism: {tp: 8, dp: 2, fsdp: hybrid_shard}
run: {horizon: 1 d, replications: 2}
faults: {components: {gpu: {mtbf: 2 d, repair: 6 h}}}
checkpoint: {interval: 30 min}
storage: {capacity: 1 PB}
"""


def stderr_before_each_draw(monkeypatch, capsys) -> list[str]:
    """What stderr has received before each replication draws its failures, one entry per replication (a
    job's or a study point's), filled in as the job runs."""
    import simulator.reliability.simulate as job_simulation

    draw = job_simulation.draw_arrivals
    before: list[str] = []

    def drawing(*args):
        before.append(capsys.readouterr().err)
        return draw(*args)

    monkeypatch.setattr(job_simulation, "draw_arrivals", drawing)
    return before


WAIT_JOB = ONE_GPU_HOSTS.replace("interval: 1000 d", "interval: 29 h") + """run: {horizon: 30 h}
faults: {components: {gpu: {mtbf: 1000 d}}}
restart: {detection: 2 min, reschedule: 3 min, launch: 5 min, warmup_steps: 0}
"""
"""One-GPU hosts on DP 4 for 30 h; a checkpoint every 29 h, which a job that first fails at 1 h never reaches (no
checkpoint, yet no warning of an interval past the horizon), so that the job's only warning is its wait for hosts."""


ONE_VALUES = {"tp": "1", "cp": "1", "pp": "1", "ep": None, "virtual_stages": "1", "micro_batch": "1",
              "sharding": "zero1", "recompute": "none"}
"""The one value `ONE_LAYOUT` gives each dimension of the search space (None: its default, as for EP)."""
ONE_LAYOUT = {flag.removeprefix("--"): ONE_VALUES[name] for name, flag in SPACE_FLAGS.items()} | {"top": "1"}
"""`trainsim search` flags that leave one layout of the search space (TP, CP, PP 1, no interleaving, micro-batch
1, ZeRO-1, no recompute) and simulate it."""


def one_layout(**changed: str | None) -> list[str]:
    """`ONE_LAYOUT` as `trainsim search` arguments with the ``changed`` flags (``micro_batch`` for
    ``--micro-batch``; None leaves the flag out, its default space searched)."""
    values = {**ONE_LAYOUT, **{name.replace("_", "-"): value for name, value in changed.items()}}
    return [arg for flag, value in values.items() if value is not None for arg in (f"--{flag}", value)]


def star_graph(hosts: list[int], bandwidth: str = "100 GB/s", link_class: str = "nvlink") -> str:
    """A `kind: graph` topology: one switch and a GPU per entry of ``hosts`` (its host number), each on a link of
    ``bandwidth`` and 1 us to the switch."""
    gpus = "".join(f"  - {{name: g{gpu}, kind: gpu, host: {host}}}\n" for gpu, host in enumerate(hosts))
    links = "".join(f"  - {{a: g{gpu}, b: sw, bandwidth: {bandwidth}, latency: 1 us, class: {link_class}}}\n"
                    for gpu in range(len(hosts)))
    return f"kind: graph\nnodes:\n  - {{name: sw, kind: switch}}\n{gpus}links:\n{links}"


UNEQUAL_HOSTS_GRAPH = star_graph([0, 0, 1, 2])
"""Three hosts of 2, 1 and 1 GPUs on one switch."""

NCCL_SIMPLE_BASE_S = 8.4e-6
"""NCCL's base latency of a Simple ring or tree collective, paid once per collective (src/graph/tuning.cc
`baseLatencies`)."""


SPINES = """
cluster: {topology: dgx-h100-cluster, nodes: 4, node: {kind: nvswitch_node, gpus: 1}, nics_per_node: 1,
          leaf_ports: 2, spines: 2, oversubscription: 2}
collectives: {channels: 4}
model: {layers: 2, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 1}
parallelism: {dp: 4}
"""
"""DP 4 over one GPU per host, two leaf groups of two hosts and two spines at 2:1: its DP ring crosses the spines
(its first flow starts after 1.2 ms of compute)."""


STRAGGLER_PIPELINE = """
cluster: {{topology: dgx-h100-cluster, nodes: 1}}
model: {{synthetic: {{stages: {p}, forward: 1 ms, backward: 2 ms}}}}
training: {{microbatches: {m}}}
parallelism: {{pp: {p}, dp: {dp}, pipeline: {{schedule: 1f1b}}}}
run: {{fold: {fold}}}
faults: {{step: {{stragglers: [{{gpus: [{gpu}], slowdown: {factor}}}]}}}}
"""
"""A synthetic 1F1B step (F = 1 ms, B = 2 ms a stage) on one DGX H100 with one straggler GPU: format p, m, dp, the
GPU, its factor and run.fold."""
