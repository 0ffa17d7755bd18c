"""summary.json's `link_tiers`: each link tier's busiest link, the tier that binds a kind of communication, and the
verdict naming it where that kind's exposed communication is the step's largest loss."""

from __future__ import annotations

import functools

import pytest
from shared import EXACT, SCENARIOS

from simulator import load_scenario, simulate
from simulator.config.loader import scenario_from_text
from simulator.metrics.summary import without_reason

RAIL_STEP = """
cluster: {{topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2, oversubscription: {ratio}}}
model: {{preset: llama3-8b, layers: 8}}
training: {{seq_len: 4096, global_batch: 8, micro_batch: 1, precision: bf16, recompute: none}}
parallelism: {{tp: 8, dp: 4, zero: 1, ddp: {{bucket: 25 MiB, overlap: true}}}}
"""
"""Llama 3 8B cut to 8 layers, TP 8 in a host x DP 4 across four DGX hosts in two leaf groups of two: every DP ring
crosses the spines twice, its exposed DP communication the step's largest loss."""

NVLINK_STEP = """
cluster: {{topology: dgx-h100}}
model: {{layers: 2, hidden: 8192, heads: 64, vocab: 32000}}
training: {{seq_len: {seq_len}, microbatches: {microbatches}}}
parallelism: {{tp: 8}}
collectives: {{algorithm: ring}}
"""
"""One DGX host, TP 8 with ring all-reduces on NVLink: at 32k tokens their 512 MiB transfers run near line rate,
at 1k tokens the ring steps' latencies hold them."""


@functools.cache
def summary_of(text: str, *overrides: str) -> dict:
    loaded = scenario_from_text(text, source="step.yaml", overrides=list(overrides))
    return simulate(loaded).summary


def test_the_leaf_spine_tier_carries_the_dp_ring_bytes_per_link_by_hand():
    """The leaf-spine tier's busiest link carries what a ring link carries in the step's ZeRO-1 exchange: per DP
    rank, 3/4 of its fp32 gradient shard reduce-scattered and 3/4 of its bf16 parameter shard gathered, the shard
    the parameters TP splits over 8 plus the norms each TP rank holds whole."""
    hidden, ffn, kv, vocab, layers = 4096, 14336, 1024, 128256, 8
    norms = 2 * hidden * layers + hidden
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn
    shard = (layers * per_layer + 2 * vocab * hidden) / 8 + norms
    ring_link_bytes = 3 / 4 * (4 + 2) * shard
    for ratio in (1, 2):
        tiers = summary_of(RAIL_STEP.format(ratio=ratio))["link_tiers"]
        dp = tiers["by_kind"]["dp"]["tiers"]
        assert dp["leaf-spine"]["bytes"] == pytest.approx(ring_link_bytes, rel=EXACT)
        assert dp["nic-leaf"]["bytes"] == pytest.approx(ring_link_bytes, rel=EXACT)
        assert dp["leaf-spine"]["line_rate_bytes_per_s"] == pytest.approx(50e9 / ratio)
        assert tiers["tiers"]["leaf-spine"]["bytes"] == pytest.approx(ring_link_bytes, rel=EXACT)
        assert tiers["tiers"]["gpu-nvswitch"]["busiest_link"].startswith("h0/")


def test_at_2_to_1_the_leaf_spine_uplinks_run_near_line_rate_and_the_verdict_names_them():
    """At 2:1 the DP transfers hold the leaf-spine links at line rate (less InfiniBand's 94% efficiency and the
    ring's latencies) for as long as they run, and the NICs' links at half that: the verdict names the leaf-spine
    tier alone, its oversubscription and its busiest link. At 1:1 the NIC-leaf and leaf-spine links run alike, and
    the NIC's is named, the fabric's within 5 points of it."""
    oversubscribed = summary_of(RAIL_STEP.format(ratio=2))
    dp = oversubscribed["link_tiers"]["by_kind"]["dp"]
    assert dp["binding"] == ["leaf-spine"]
    assert 0.9 < dp["tiers"]["leaf-spine"]["utilisation_in_transfers"] <= 0.94
    assert dp["tiers"]["nic-leaf"]["utilisation_in_transfers"] == pytest.approx(
        dp["tiers"]["leaf-spine"]["utilisation_in_transfers"] / 2, rel=EXACT)
    verdict = oversubscribed["bottleneck"]["verdict"]
    assert oversubscribed["bottleneck"]["largest_loss"]["name"] == "exposed_dp_comm"
    link = dp["tiers"]["leaf-spine"]["busiest_link"]
    assert (f"DP transfers bound by the leaf-spine links, oversubscribed 2:1 (the busiest, {link}, at "
            f"{100 * dp['tiers']['leaf-spine']['utilisation_in_transfers']:.1f}% of line rate") in verdict
    assert oversubscribed["bottleneck"]["binding_tier"]["tier"] == "leaf-spine"
    balanced = summary_of(RAIL_STEP.format(ratio=1))
    assert balanced["link_tiers"]["by_kind"]["dp"]["binding"] == ["nic-leaf", "leaf-spine"]
    assert "DP transfers bound by the NIC-leaf links (the busiest" in balanced["bottleneck"]["verdict"]
    assert "the leaf-spine links within 5 points of it)" in balanced["bottleneck"]["verdict"]
    assert "oversubscribed" not in balanced["bottleneck"]["verdict"]


def test_the_top_level_tiers_read_utilisation_in_transfers_by_the_rule_by_kind_does():
    """Over every flow, a link's utilisation in transfers is over the time the transfers crossing it run, of any
    kind, as under `by_kind`: at 2:1 h0/nic0->leaf0.r0 carries the DP ring's bytes (the first test's 1.5728e9 B)
    and only DP flows, so it reads what `by_kind.dp` reads, 1.5728e9 / (50e9 x 0.068247 s, the DP exchange's
    time) = 0.4609, not 0.9043, the link's own flows' time (0.034784 s: its hops inside the leaf finish while the
    ring's hops across the spines, at half the line rate, still run); and the 25 GB/s uplink it feeds twice that."""
    tiers = summary_of(RAIL_STEP.format(ratio=2))["link_tiers"]
    dp = tiers["by_kind"]["dp"]
    nic, dp_nic = tiers["tiers"]["nic-leaf"], dp["tiers"]["nic-leaf"]
    assert nic["busiest_link"] == dp_nic["busiest_link"] == "h0/nic0->leaf0.r0"
    assert nic["utilisation_in_transfers"] == pytest.approx(nic["bytes"] / (50e9 * dp["transfer_s"]), rel=EXACT)
    assert nic["utilisation_in_transfers"] == pytest.approx(dp_nic["utilisation_in_transfers"], rel=EXACT)
    assert nic["utilisation_in_transfers"] == pytest.approx(0.4609, abs=1e-4)
    assert tiers["tiers"]["leaf-spine"]["utilisation_in_transfers"] == pytest.approx(
        2 * nic["utilisation_in_transfers"], rel=EXACT)


def test_a_table_of_one_line_per_step_keeps_the_tier_and_drops_its_figures():
    bottleneck = summary_of(RAIL_STEP.format(ratio=2))["bottleneck"]
    short = without_reason(bottleneck["verdict"], bottleneck["verdict_exposed_share"])
    assert short.endswith("; DP transfers bound by the leaf-spine links, oversubscribed 2:1")
    assert short.startswith("communication-bound (all exposed communication")


def test_the_nvswitch_tier_binds_tensor_parallelism_on_nvlink_and_a_compute_bound_verdict_names_none():
    """At 32k tokens the TP all-reduces run near NVLink's line rate: the GPU-NVSwitch tier binds them. Their exposed
    time, 17.6% of the step, is its largest loss, but the step is compute-bound, and only a communication-bound
    verdict names a tier."""
    summary = summary_of(NVLINK_STEP.format(seq_len=32768, microbatches=1))
    tp = summary["link_tiers"]["by_kind"]["tp"]
    assert tp["binding"] == ["gpu-nvswitch"]
    assert summary["bottleneck"]["largest_loss"]["name"] == "exposed_tp_comm"
    assert summary["bottleneck"]["constraint"] == "compute"
    assert "bound by the" not in summary["bottleneck"]["verdict"]


def test_latency_bound_transfers_name_no_tier():
    """At 1,024 tokens a TP all-reduce is 16 MiB, a ring step 2 MiB, which NVLink carries in about the time of a
    step's latencies: the links run at 56% of line rate while the transfers cross them, well below the 82% NVLink
    carries, and the verdict claims no tier binds though exposed TP communication is the largest loss."""
    summary = summary_of(NVLINK_STEP.format(seq_len=1024, microbatches=8))
    tp = summary["link_tiers"]["by_kind"]["tp"]
    figures = tp["tiers"]["gpu-nvswitch"]
    assert figures["utilisation_in_transfers"] < figures["usable_fraction"] - 0.05
    assert tp["binding"] == []
    assert summary["bottleneck"]["largest_loss"]["name"] == "exposed_tp_comm"
    assert "bound by the" not in summary["bottleneck"]["verdict"]
    assert "binding_tier" not in summary["bottleneck"]


CP_STEP = """
cluster: {topology: dgx-h100-cluster, nodes: 8, leaf_ports: 2, spines: 2, oversubscription: 2}
model: {layers: 8, hidden: 2048, heads: 16, kv_heads: 4, vocab: 32000}
training: {seq_len: 16384, microbatches: 4, precision: bf16}
parallelism: {tp: 4, cp: 4, pp: 2, dp: 2, order: [tp, cp, pp, dp], sequence_parallel: true, cp_algorithm: all_gather}
collectives: {algorithm: ring}
"""


@pytest.mark.parametrize("text", [RAIL_STEP.format(ratio=2), CP_STEP], ids=["rails-2to1", "cp-pp-dp"])
def test_a_folded_step_gives_the_tiers_of_the_unfolded_one(text):
    folded, unfolded = summary_of(text), summary_of(text, "run.fold=false")
    assert folded["folded"] and not unfolded["folded"]
    assert folded["link_tiers"].keys() == unfolded["link_tiers"].keys()
    _assert_same(folded["link_tiers"], unfolded["link_tiers"])
    assert folded["bottleneck"]["verdict"] == unfolded["bottleneck"]["verdict"]


def _assert_same(folded: object, unfolded: object) -> None:
    if isinstance(folded, dict):
        assert isinstance(unfolded, dict) and folded.keys() == unfolded.keys()
        for key in folded:
            _assert_same(folded[key], unfolded[key])
    elif isinstance(folded, float):
        assert folded == pytest.approx(unfolded, rel=EXACT)
    else:
        assert folded == unfolded


def test_a_link_down_mid_step_makes_the_tiers_approximate_and_the_verdict_names_no_tier():
    """The spine link that fails 5 ms into the step sends 4 routes around it: each rerouted flow keeps one row, its
    detour's route with all its bytes, which held a leaf's uplink at 96.8% of line rate against a usable 94.0%. The
    tiers say why they are approximate and the verdict names no tier; without the link fault it names the NIC-leaf
    tier, and from the step's start a degraded link leaves the tiers exact."""
    path = str(SCENARIOS / "faults-straggler-and-spine-link.yaml")
    faulted = simulate(load_scenario(path)).summary
    rerouted = faulted["faults"]["rerouted_routes"]
    assert rerouted == 4
    assert faulted["link_tiers"]["approximate_because"] == (
        "4 routes took a detour around links down: a rerouted flow's bytes all count on its detour")
    assert faulted["bottleneck"]["largest_loss"]["name"] == "exposed_dp_comm"
    assert "bound by the" not in faulted["bottleneck"]["verdict"]
    assert "binding_tier" not in faulted["bottleneck"]
    healthy = simulate(load_scenario(path, ["faults.step.links=[]"])).summary
    assert healthy["link_tiers"]["approximate_because"] is None
    assert "DP transfers bound by the NIC-leaf links" in healthy["bottleneck"]["verdict"]
    degraded = simulate(load_scenario(path, ["faults.step.links=[{link: [leaf0.r0, spine0], capacity: 0.5}]"]))
    assert degraded.summary["link_tiers"]["approximate_because"] is None
    timed = simulate(load_scenario(path, ["faults.step.links=[{link: [leaf0.r0, spine0], capacity: 0.5, at: 5 ms}]"]))
    assert timed.summary["link_tiers"]["approximate_because"] == (
        "link capacities change during the step, which a link's one usable fraction does not follow")


def test_a_compute_bound_step_names_no_tier_though_one_binds_its_largest_loss():
    """DP 8 on one DGX H100 is compute-bound, its largest loss DP's exposed communication (3.0% of the step), which
    the GPU-NVSwitch links bind at 78.6% of line rate: a tier is named only where communication bounds the step,
    so verdicts near the binding threshold do not flip with a tenth of a point of utilisation."""
    summary = simulate(load_scenario(str(SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"))).summary
    assert summary["link_tiers"]["by_kind"]["dp"]["binding"] == ["gpu-nvswitch"]
    assert summary["bottleneck"]["constraint"] == "compute"
    assert summary["bottleneck"]["largest_loss"]["name"] == "exposed_dp_comm"
    assert "bound by the" not in summary["bottleneck"]["verdict"]
    assert "binding_tier" not in summary["bottleneck"]


def _two_leaf_graph(uplink: str) -> str:
    """A `graph` file: four one-GPU hosts, two on each of two leaf switches at 50 GB/s a GPU, each leaf on one
    spine switch at ``uplink``."""
    gpus = "".join(f"  - {{name: g{gpu}, kind: gpu, host: {gpu}}}\n" for gpu in range(4))
    links = "".join(f"  - {{a: g{gpu}, b: leaf{gpu // 2}, bandwidth: 50 GB/s, latency: 1 us, class: infiniband}}\n"
                    for gpu in range(4))
    links += "".join(f"  - {{a: leaf{leaf}, b: spine, bandwidth: {uplink}, latency: 1 us, class: infiniband}}\n"
                     for leaf in range(2))
    return ("kind: graph\nnodes:\n  - {name: spine, kind: switch}\n  - {name: leaf0, kind: switch}\n"
            f"  - {{name: leaf1, kind: switch}}\n{gpus}links:\n{links}")


GRAPH_DP4 = """cluster: {topology: graph.yaml}
model: {layers: 2, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 1}
parallelism: {dp: 4}
"""


def test_a_graph_fabric_oversubscribed_at_its_leaves_is_named_in_the_verdict(tmp_path):
    """On a `graph` file whose leaves have 2 x 50 GB/s down and 25 GB/s up (4:1 by hand), the DP ring's two
    crossings each hold a 25 GB/s uplink while each GPU link carries as many bytes at 50 GB/s: the switch-switch
    links bind the DP transfers, and the verdict names their oversubscription at the busiest link's leaf, as it
    does a built leaf-spine fabric's. At 100 GB/s up (1:1, as much up as down) no oversubscription is named."""
    from simulator.topology.describe import link_subscription
    from simulator.topology.loader import scenario_topology

    for uplink, ratio in (("25 GB/s", "4:1"), ("100 GB/s", None)):
        (tmp_path / "graph.yaml").write_text(_two_leaf_graph(uplink))
        (tmp_path / "step.yaml").write_text(GRAPH_DP4)
        loaded = load_scenario(str(tmp_path / "step.yaml"))
        topology = scenario_topology(loaded)
        assert link_subscription(topology, "spine", "leaf1") == ("leaf1", 100e9 / float(uplink.split()[0]) / 1e9)
        assert link_subscription(topology, "g0", "leaf0") is None  # a GPU below: no switch's uplink
        summary = simulate(loaded).summary
        verdict = summary["bottleneck"]["verdict"]
        if ratio is None:
            assert "oversubscribed" not in verdict
            continue
        busiest = summary["bottleneck"]["binding_tier"]["busiest_link"]
        leaf = next(end for end in busiest.split("->") if end.startswith("leaf"))
        assert summary["bottleneck"]["binding_tier"]["tier"] == "switch-switch"
        named = f"DP transfers bound by the switch-switch links, oversubscribed {ratio} at {leaf} (the busiest"
        assert named in verdict


def test_a_parameter_server_runs_link_tiers_name_the_links_its_sides_rule_names():
    """One rule for both: a link's utilisation is taken over the time the transfers crossing it run. A push or a
    pull is one flow, so the busiest NIC-leaf link, the server host's first NIC sending pulls, runs at what an
    InfiniBand link carries (94% of line rate) while they do, as `parameter_server.server_links` reads it; over the
    DP kind's whole 2.71 s (pushes to the other direction included) it read 43.9% and named no tier. The verdict
    names the NIC-leaf tier and the server side, at the same figure."""
    summary = simulate(load_scenario(SCENARIOS / "parameter-server-vs-allreduce.yaml", [])).summary
    dp, ps = summary["link_tiers"]["by_kind"]["dp"], summary["parameter_server"]
    assert dp["binding"] == ["nic-leaf"]
    nic = dp["tiers"]["nic-leaf"]
    server_gpu = ps["server_links"]["per_server_gpu"][str(ps["server_gpus"][0])]
    assert nic["busiest_link"] == "->".join(reversed(server_gpu["link"].split("->")))
    assert nic["utilisation_in_transfers"] == pytest.approx(server_gpu["egress_utilisation_in_transfers"], rel=EXACT)
    assert nic["utilisation_in_transfers"] == pytest.approx(nic["usable_fraction"], rel=1e-4)
    assert ps["binding_links"] == "server"
    assert (f"DP transfers bound by the NIC-leaf links (the busiest, {nic['busiest_link']}, at 94.0% of line rate"
            in summary["bottleneck"]["verdict"])
    assert "the server links bind: their busiest runs at 94.0%" in summary["bottleneck"]["verdict"]
