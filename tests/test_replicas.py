"""Data-parallel replicas as images of each other: the fabric's spine hash moves with a shift by whole leaf
groups, it still spreads one leaf's flows evenly over the spines, and a folded run that sends only the first
replicas' flows (engine/replicas.py) gives the step of the full run, bit for bit on these fabrics."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from shared import CP_FABRIC, DP_FABRIC, THREE_TIERS

import simulator.simulation as simulation
from simulator.engine.lockstep import Lockstep
from simulator.engine.plans import PlanCache
from simulator.engine.replicas import _representatives, replica_quotient
from simulator.parallel.layout import Layout
from simulator.program.ops import CollectiveOp
from simulator.report.trace import write_trace
from simulator.report.writers import link_tracks
from simulator.topology.builders import build_topology

FABRIC = {"nodes": 8, "leaf_ports": 2, "spines": 4, "oversubscription": 2,
          "node": {"kind": "nvswitch_node", "gpus": 8}}


def _shifted(name: str, hosts: int, leaf_ports: int, nodes: int) -> str:
    """A node's name after shifting every host by ``hosts`` (whole leaf groups), cyclically."""
    name = re.sub(r"^h(\d+)/", lambda m: f"h{(int(m[1]) + hosts) % nodes}/", name)
    groups = nodes // leaf_ports
    return re.sub(r"^leaf(\d+)\.", lambda m: f"leaf{(int(m[1]) + hosts // leaf_ports) % groups}.", name)


def test_routes_move_with_a_shift_by_whole_leaf_groups():
    """Every cross-leaf route, shifted by one leaf group (2 hosts, 16 GPUs), is the route of the shifted pair:
    the spine is hashed from the source's place in its leaf group and the destination's offset."""
    topology = build_topology("cluster", FABRIC)
    gpus = topology.num_gpus
    crossing = 0
    for src in range(gpus):
        for dst in range(gpus):
            for channel in (0, 1):
                if topology.gpu_host[src] == topology.gpu_host[dst]:
                    continue
                route = topology.router(topology, src, dst, channel)
                image = topology.router(topology, (src + 16) % gpus, (dst + 16) % gpus, channel)
                assert image == [_shifted(node, 2, 2, 8) for node in route]
                crossing += any(node.startswith("spine") for node in route)
    assert crossing > 0


def test_one_leaf_spreads_its_flows_over_the_spines_as_a_random_hash_would():
    """All flows from one leaf group of 32 hosts to another (and to all others), per channel, over 8 spines:
    the busiest spine carries at most 1.3x the flows of the idlest (today 1.27; 1,024 random draws spread about
    that much). The 16 hosts of one replica half sending to the next replica (one offset, neighbouring places,
    two channels: a data-parallel ring's crossings) use 14 of 16 spines, at most 4 flows on one; a hash that
    mixed its inputs only linearly put 7 on one spine and used 7."""
    topology = build_topology("cluster", {**FABRIC, "nodes": 128, "leaf_ports": 32, "spines": 8,
                                          "oversubscription": 1})
    fabric = topology.router
    for targets in (range(32, 64), range(32, 128)):
        for channel in (0, 1):
            spines = Counter(fabric._hops(src * 8, dst * 8, channel)[2] for src in range(32) for dst in targets)
            assert len(spines) == 8
            assert max(spines.values()) / min(spines.values()) < 1.3
    wide = build_topology("cluster", {**FABRIC, "nodes": 2048, "leaf_ports": 32, "spines": 16,
                                      "oversubscription": 1}).router
    crossing = Counter(wide._hops((16 + p) * 8, (32 + p) * 8, channel)[2] for p in range(16) for channel in (0, 1))
    assert len(crossing) >= 14 and max(crossing.values()) <= 4


@pytest.fixture
def folded_as_checked(monkeypatch):
    """Runs stay folded when the checks before the run pass, whatever the run's mirrors did: on CP_FABRIC the
    pipeline hand-offs of the lanes end apart (0.18 ms for the backward receive of micro-batch 3), which makes
    the step run unfolded (engine/lockstep.py, tests/test_folding.py); the quotient is checked against the
    folded run all the same."""
    monkeypatch.setattr(simulation, "lockstep", lambda *args: Lockstep())


@pytest.mark.parametrize("text, overrides, folding_error", [
    (CP_FABRIC, (), 1e-9),  # K/V all-gathers and sends of both replicas share NICs with the DP ring
    (CP_FABRIC, ("cluster.leaf_ports=1", "parallelism.tp=8", "parallelism.cp=2"), 1e-9),  # 1 host/leaf
    # per-block gathers: kept flows meet images' on links. Folding itself (not the quotient: folded with every
    # replica's flows gives the same step, bit for bit) is 5.43e-5 short of the unfolded step here: the pipeline
    # send/recvs, which engine/symmetry.py does not compare, hash host 2 -> 0 onto spine 0 and host 3 -> 1 onto
    # spine 1, where they meet the other cross-leaf traffic unevenly: each backward receive on host 1 ends
    # 0.18-0.34 ms before the representative's on host 0, so host 1's ranks run that block's backward ahead (until
    # the CP reduce-scatter joins them) and meet the other traffic at other times, which the folded mirrors cannot
    # (6.15e-5 with its small collectives under LL and LL128, as auto picks them; 5.43e-5 all under Simple)
    (CP_FABRIC, ("parallelism.zero=3",), 7e-5),
    (DP_FABRIC, (), 1e-9),  # 16 two-host replicas, one per leaf group, TP 4 x PP 4
    (THREE_TIERS, (), 1e-9),  # pods of two replicas: the shift moves by two, half the replicas sent
    (THREE_TIERS, ("cluster.pods=4",), 1e-9),  # a pod per replica, rings across the cores
])
def test_first_replicas_alone_give_the_full_step(run_yaml, monkeypatch, folded_as_checked, text, overrides,
                                                 folding_error):
    """Folded with the replica quotient, folded with every replica's flows, and unfolded: the same step time
    (bit-equal to every replica's; within ``folding_error`` of the unfolded run: 1e-9 where its flows only meet
    in another order) and traffic per GPU (to rounding: flows under LL128 carry 128/120 of their payload, which
    the reports take back off, summed over other ranks in the two runs). The quotient sends, of each collective,
    the flows of every replica's run whose source lies in the replicas it keeps (or all of them where the
    collective is timed alone and replayed, meeting no other traffic), and fewer flows in all. With ZeRO-3 a kept
    flow that contended on its own route instead of its links' orbit representatives would miss its images' load
    and finish 1.07% early."""
    replayed: set[str] = set()
    monkeypatch.setattr(simulation, "private_collectives", _recording_replayed_keys(replayed))
    quotient = run_yaml(text, *overrides)
    unfolded = run_yaml(text, *overrides, "run.fold=false").summary
    monkeypatch.setattr(simulation, "replica_quotient", lambda ops, layout, plans, mirrors, private, shapes=None:
                        (None, dict(mirrors)))
    every_replica = run_yaml(text, *overrides)
    summary = quotient.summary
    assert summary["folded"] and "fold_off_reason" not in summary
    assert summary["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=folding_error)
    assert summary["step_time_s"] == every_replica.summary["step_time_s"]
    assert summary["traffic_bytes_per_gpu"] == pytest.approx(unfolded["traffic_bytes_per_gpu"], rel=1e-12)
    layout = summary["layout"]
    stride = int(np.prod([layout[axis] for axis in layout["order"][:layout["order"].index("dp")]]))
    kept = summary["replica_quotient"]["replicas_sent"]
    sent, every = _flows_by_key(quotient), _flows_by_key(every_replica)
    assert sent.keys() == every.keys()
    for key, flows in every.items():
        own = Counter({flow: n for flow, n in flows.items() if flow[0] // stride % layout["dp"] < kept})
        assert sent[key] == (flows if key in replayed else own), key
    assert summary["flows_simulated"] == sum(map(Counter.total, sent.values()))
    assert summary["flows_simulated"] < every_replica.summary["flows_simulated"]


def _recording_replayed_keys(keys: set[str]):
    """simulation.private_collectives, adding the keys of the collectives it picks for replay to ``keys``."""
    private_collectives = simulation.private_collectives

    def record(ops, *args, **kwargs):
        private = private_collectives(ops, *args, **kwargs)
        keys.update(op.key for op in ops if op.id in private)
        return private

    return record


def _flows_by_key(result) -> dict[str, Counter]:
    """The timeline's flows per collective key, each as (source, destination, bytes)."""
    frame = result.timeline
    flows = frame[frame["kind"] == "flow"]
    by_key: dict[str, Counter] = {}
    for key, src, dst, nbytes in zip(flows["key"], flows["src"], flows["dst"], flows["bytes"], strict=True):
        by_key.setdefault(key, Counter())[(src, dst, nbytes)] += 1
    return by_key


def test_replicas_within_one_leaf_group_keep_every_flow(run_yaml, monkeypatch):
    """Two-host replicas on leaf groups of 32 hosts: no shift by whole replicas is a period of the spine hash,
    so the folded run sends every replica's flows, as without the quotient."""
    summary = run_yaml(DP_FABRIC, "cluster.leaf_ports=32").summary
    monkeypatch.setattr(simulation, "replica_quotient", lambda ops, layout, plans, mirrors, private, shapes=None:
                        (None, dict(mirrors)))
    assert summary["flows_simulated"] == run_yaml(DP_FABRIC, "cluster.leaf_ports=32").summary["flows_simulated"]


TREE_DP = """
cluster: {topology: dgx-h100-cluster, nodes: 32, leaf_ports: 2}
model: {layers: 4, hidden: 256, heads: 4, vocab: 1000}
training: {seq_len: 256, global_batch: 64, micro_batch: 1}
parallelism: {tp: 4, pp: 4, dp: 16, zero: 0, ddp: {bucket: 64 KiB}}
"""


def test_a_tree_all_reduce_across_replicas_keeps_every_flow(run_yaml, monkeypatch):
    """Small buckets over 16 replicas: ``auto`` picks NCCL's tree for the data-parallel all-reduces, whose
    phases mix transfers from the first replicas with others that are not their images (a tree is not
    shift-invariant), so dropping the others would end a phase early: the quotient is refused, every flow is
    sent and the step is the unfolded one."""
    quotient = run_yaml(TREE_DP).summary
    unfolded = run_yaml(TREE_DP, "run.fold=false").summary
    monkeypatch.setattr(simulation, "replica_quotient", lambda ops, layout, plans, mirrors, private, shapes=None:
                        (None, dict(mirrors)))
    every_replica = run_yaml(TREE_DP).summary
    assert quotient["flows_simulated"] == every_replica["flows_simulated"]
    assert quotient["step_time_s"] == pytest.approx(unfolded["step_time_s"], rel=1e-9)


ONE_HOST_LEAVES = {**FABRIC, "nodes": 4, "leaf_ports": 1, "spines": 2}
"""Four hosts of 8 GPUs, one per leaf group: with TP 8 x DP 4 the shift by one replica moves by one leaf group."""
RING = CollectiveOp(id=0, rank=0, stream="dp", name="all_reduce", op="all_reduce", group=(0, 8, 16, 24),
                    nbytes=1e6, key="dp", algorithm="ring")
"""Rank 0's data-parallel all-reduce: its ring is its own image under the shift."""
ACROSS = ((8, 16), (16, 24), (24, 0))
"""The images of the pair (0, 8) under the shift, as the mirrors of a collective over that pair."""


def _quotient(op: CollectiveOp, topology=None):
    """replica_quotient of the single ``op`` over TP 8 x DP 4 on ONE_HOST_LEAVES (or ``topology``)."""
    topology = topology or build_topology("cluster", ONE_HOST_LEAVES)
    found, _ = replica_quotient([op], Layout(tp=8, dp=4), PlanCache(topology), {op.id: op.mirrors}, frozenset())
    return found


def test_a_shift_invariant_ring_gets_a_quotient_whose_links_have_orbits_of_dp():
    """The control for the refusals below: the first replica alone is sent, each used link stands for the four
    links of its orbit (a representative is its orbit's lowest id)."""
    quotient = _quotient(RING)
    assert quotient is not None
    assert quotient.kept.tolist() == [gpu < 8 for gpu in range(32)]
    used = quotient.representative != np.arange(quotient.representative.size)
    assert Counter(quotient.representative[used].tolist()) == Counter(
        {link: 3 for link in set(quotient.representative[used].tolist())})


def test_a_plan_across_replicas_that_sends_from_both_sides_is_refused():
    """An all-reduce over (0, 8), mirrored on the shifted pairs, is not its own image and its ring sends from
    rank 0 (kept) and rank 8 (not): in the quotient its phase would end with 0 -> 8 alone, before 8 -> 0, which
    is not the image of a kept flow of this plan. A send 0 -> 8 over the same pairs sends from one side only
    and keeps the quotient."""
    pair = CollectiveOp(id=0, rank=0, stream="dp", name="pair", op="all_reduce", group=(0, 8), nbytes=1e6,
                        key="pair", algorithm="ring", mirrors=ACROSS)
    send = CollectiveOp(id=0, rank=0, stream="pp", name="send", op="send_recv", group=(0, 8), nbytes=1e6,
                        key="send", mirrors=ACROSS)
    assert _quotient(pair) is None
    assert _quotient(send) is not None


def test_a_shift_onto_a_link_of_another_bandwidth_is_refused():
    """Replica 1's leaf-spine uplink on its ring hop degraded to half: the shift maps replica 0's uplink onto a
    link of another bandwidth, so the replicas are not images of each other."""
    topology = build_topology("cluster", ONE_HOST_LEAVES)
    uplink = next(link for link in topology.path(8, 16, 0) if topology.link_ends[link][1].startswith("spine"))
    topology.link_bandwidth = topology.link_bandwidth.copy()
    topology.link_bandwidth[uplink] /= 2
    assert _quotient(RING, topology) is None


def test_an_orbit_of_the_wrong_length_is_refused():
    """Links that the shift cycles in fewer steps than the replicas it cycles (here a link swapped with another
    under a shift of order 4), or that leave the links the run uses, have no representative."""
    assert _representatives({0: 1, 1: 2, 2: 3, 3: 0}, 4, 6).tolist() == [0, 0, 0, 0, 4, 5]
    assert _representatives({0: 1, 1: 0}, 4, 6) is None
    assert _representatives({0: 1, 1: 2, 2: 3}, 4, 6) is None
@pytest.mark.parametrize("text, sent", [
    (CP_FABRIC, {"replicas": 2, "replicas_sent": 1}),  # K/V rings and the DP ring: NICs shared across replicas
    (DP_FABRIC, {"replicas": 16, "replicas_sent": 1}),  # each flow stands for 16
    (THREE_TIERS, {"replicas": 4, "replicas_sent": 2}),  # pods of two replicas
])
def test_link_tracks_count_the_flows_the_quotient_did_not_send(run_yaml, monkeypatch, folded_as_checked, tmp_path,
                                                                text, sent):
    """The trace's link tracks of a quotient run (each sent flow loading its links' orbits) equal those of the
    folded run that sends every replica's flows: the same links, every bin's utilisation to 1e-9 (today equal
    to the bit; the first replica's links showed up to 0.86 of line rate less when the dropped flows were
    simply missing). The summary says how many replicas' flows the timeline holds."""
    quotient = run_yaml(text)
    monkeypatch.setattr(simulation, "replica_quotient", lambda ops, layout, plans, mirrors, private, shapes=None:
                        (None, dict(mirrors)))
    every_replica = run_yaml(text)
    assert quotient.summary["replica_quotient"] == sent and "replica_quotient" not in every_replica.summary
    assert quotient.flow_routes.for_orbit is not None and quotient.flow_routes.for_orbit.any()
    assert every_replica.flow_routes.for_orbit is None
    shown, expected = link_tracks(quotient), link_tracks(every_replica)
    assert shown.links == expected.links and len(shown.links) > 20
    assert np.array_equal(shown.edges_s, expected.edges_s)
    assert np.abs(shown.utilisation - expected.utilisation).max() <= 1e-9
    traces = []
    for name, result, load in (("quotient", quotient, shown), ("every", every_replica, expected)):
        write_trace(tmp_path / name, result.log.columns(), result.topology, flows=False, load=load, compress=False)
        traces.append((tmp_path / name).read_bytes())
    assert traces[0] == traces[1]  # the default trace (ops+links): op slices and link tracks, byte for byte


def test_folded_traffic_is_the_mean_over_members_when_a_tree_sends_unevenly(run_yaml, folded_as_checked):
    """`collectives.algorithm: auto` picks a tree for the 4 KiB gradient bucket of the last stage under Simple: its
    members send 6 or 8 KiB, so the representative's own flows are not the mean; the folded run adds the group's
    mean less its own share and reports the unfolded figure (before: dp 211,545,088 against 211,545,600 bytes).
    (With the protocol left to auto, the LL ring takes that bucket, whose members send alike.)"""
    folded = run_yaml(CP_FABRIC, "collectives.algorithm=auto", "collectives.protocol=simple")
    unfolded = run_yaml(CP_FABRIC, "collectives.algorithm=auto", "collectives.protocol=simple", "run.fold=false")
    frame = unfolded.timeline
    keys = set(frame.loc[(frame["kind"] == "collective") & (frame["category"] == "dp"), "key"])
    sent = frame[(frame["kind"] == "flow") & frame["name"].isin(keys)].groupby(["name", "src"])["bytes"].sum()
    assert (sent.groupby("name").min() != sent.groupby("name").max()).any()
    assert folded.summary["folded"]
    assert folded.summary["traffic_bytes_per_gpu"] == pytest.approx(unfolded.summary["traffic_bytes_per_gpu"],
                                                                     rel=1e-12)
