"""Elastic jobs on GB200 NVL72 racks: a shrunk job keeps the trays of the replicas it runs on, whole racks then a
last rack of the trays left (`last_rack_trays`), each tray in its rack's NVLink domain; its step is a plain
`simulate()` of that smaller cluster, and a size whose TP or EP groups leave the NVLink domains the full job's
stayed in is refused at load (on every cluster kind: a DGX host is its own NVLink domain)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from shared import DP_INNERMOST_DGX, STEP_ONLY, H

from simulator import simulate
from simulator.cli import main
from simulator.config.loader import scenario_from_text
from simulator.parallel.experts import ep_group
from simulator.parallel.layout import Layout
from simulator.reliability.elastic import elastic_sizes, group_domains, shrunk_scenario, shrunk_settings
from simulator.reliability.states import ClusterState, StepStates
from simulator.topology.loader import scenario_topology


def job(racks: int = 2, trays: int = 4, parallelism: str = "tp: 4, dp: 8", last: int | None = None) -> str:
    """A job on ``racks`` GB200 racks of ``trays`` trays (4 GPUs each; ``last`` in the last rack where given)."""
    kept = "" if last is None else f", last_rack_trays: {last}"
    return f"""cluster: {{topology: gb200-nvl72, racks: {racks}, trays: {trays}{kept}, leaf_ports: 4, spines: 2}}
model: {{layers: 4, hidden: 2048, heads: 16, vocab: 32000}}
training: {{seq_len: 1024, microbatches: 2}}
parallelism: {{{parallelism}}}
checkpoint: {{interval: 30 min}}
storage: {{capacity: 1 PB}}
run: {{horizon: 12 h}}
faults: {{components: {{gpu: {{mtbf: 1000 d, repair: 2 h}}, software: {{mtbf: 1000 d}}}}}}
restart: {{detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0, elastic: true}}
"""


@pytest.mark.parametrize("racks, trays, layout, kept", [
    (2, 4, "tp: 4, dp: {}", {size: (-(-size // 4), size - 4 * (-(-size // 4) - 1)) for size in range(1, 9)}),
    (4, 2, "tp: 4, pp: 4, dp: {}", {1: (2, 2), 2: (4, 2)}),
], ids=["replicas-of-one-tray", "replicas-spanning-two-racks"])
def test_each_size_steps_as_a_plain_simulation_of_the_racks_it_keeps(racks, trays, layout, kept):
    """A replica of one tray: the job shrunk to k replicas keeps k trays, whole racks of 4 then the rest in the last
    rack (7: 2 racks, the last with 3 trays); a replica spanning 2 racks: whole racks (1 replica: 2 racks). Each
    size's step is `simulate()` of the scenario written for that cluster, bit for bit, and its GPUs sit in the
    NVLink domains they had in the full cluster."""
    full = max(kept)
    loaded = scenario_from_text(job(racks, trays, layout.format(full)), "job.yaml")
    topology = scenario_topology(loaded)
    assert elastic_sizes(loaded, topology).sizes == tuple(kept)
    states = StepStates(loaded, topology)
    steps = set()
    for size, (kept_racks, last) in kept.items():
        smaller = scenario_from_text(job(kept_racks, trays, layout.format(size), last), "job.yaml", [STEP_ONLY])
        cluster = scenario_topology(smaller)
        assert cluster.gpu_domain == topology.gpu_domain[:cluster.num_gpus]
        step = states(ClusterState(size))
        assert step is not None and step.step_s == simulate(smaller).summary["step_time_s"]
        steps.add(step.step_s)
    assert len(steps) == len(kept)


def test_a_failed_tray_shrinks_the_job_by_its_replica_and_a_restart_grows_it_back(job_with):
    """GPU 13 (tray 3 of rack 0) fails at 1 h, back at 3 h; no spares: the job restarts on 7 replicas, the 7
    trays of a rack and 3 of the next, and a software failure at 5 h finds the tray back: it grows to 8. One
    shrink, one regrow; the 7-replica steps are `simulate()`'s of that cluster."""
    summary = job_with(job(), (1 * H, 0, 13, 2 * H), (5 * H, 1, 0, 0.0)).summary
    assert summary["replicas"]["sizes"] == list(range(1, 9))
    assert (summary["replicas"]["shrinks"]["mean"], summary["replicas"]["regrows"]["mean"]) == (1, 1)
    assert set(summary["replicas"]["running_s"]) == {"7", "8"}
    shrunk = next(state for state in summary["states"] if state["replicas"] == 7)
    alone = simulate(scenario_from_text(job(2, 4, "tp: 4, dp: 7", 3), "job.yaml", [STEP_ONLY])).summary["step_time_s"]
    assert shrunk["step_time_s"] == alone


ORDERED = """cluster: {topology: gb200-nvl72, racks: 2, trays: 2, leaf_ports: 2, spines: 2}
model: {layers: 2, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 2}
parallelism: {tp: 2, pp: 2, dp: 4, order: [dp, tp, cp, pp]}
checkpoint: {interval: 30 min}
storage: {capacity: 1 PB}
run: {horizon: 1 d}
faults: {components: {gpu: {mtbf: 30 d, repair: 2 h}}}
restart: {elastic: true}
"""


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_size_whose_tp_groups_leave_their_rack_is_refused_at_parallelism_tp(command, tmp_path, capsys,
                                                                            monkeypatch):
    """DP innermost (order [dp, tp, cp, pp]) on 2 racks of 8 GPUs: the full job's TP groups (ranks r, r + 4)
    stay in a rack, stage 1 in the second. Shrunk to 3 replicas the TP stride is 3 and stage 1 starts at GPU 6:
    its group (6, 9) spans both racks, its per-layer collectives would leave NVLink. Refused in one line at
    `parallelism.tp`, naming the size and the `min_replicas` that avoids it, before any step."""
    monkeypatch.setattr("simulator.reliability.simulate.StepStates", None)
    scenario = tmp_path / "job.yaml"
    scenario.write_text(ORDERED)
    args = ["--out", str(tmp_path / "out")] if command == "run" else []
    assert main([command, str(scenario), *args]) == 2
    assert capsys.readouterr().err == (
        f"error: {scenario}:4: parallelism.tp: the elastic job shrunk to 3 replicas (3 hosts): a TP group spans 2 "
        "NVLink domains, where each of the full job's stays inside one (allowed: a parallelism.order that keeps each "
        "TP group inside one NVLink domain on fewer replicas; or restart.min_replicas above 3)\n")
    assert not (tmp_path / "out").exists()


EXPERTS = """cluster: {topology: gb200-nvl72, racks: 2, trays: 2, leaf_ports: 2, spines: 2}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000, moe: {experts: 8, top_k: 2}}
training: {seq_len: 2048, microbatches: 4}
parallelism: {tp: 1, cp: 2, pp: 2, dp: 4, ep: 2, order: [tp, dp, pp, cp]}
checkpoint: {interval: 30 min}
storage: {capacity: 1 PB}
run: {horizon: 1 d}
faults: {components: {gpu: {mtbf: 30 d, repair: 2 h}}}
restart: {elastic: true}
"""


def test_a_size_whose_ep_groups_leave_their_rack_is_refused_as_an_ep_group(tmp_path, capsys):
    """CP outermost, DP inside it (order [tp, dp, pp, cp]) on 2 racks of 8 GPUs: shrunk to 3 replicas, rank 0's DP x CP
    group is GPUs {0, 1, 2, 6, 7, 8} and its EP block {7, 8} straddles the racks, where each of the full job's stays
    in one. The refusal reads 'an EP group', not 'a EP group'."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(EXPERTS)
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (
        f"error: {scenario}:4: parallelism.ep: the elastic job shrunk to 3 replicas (3 hosts): an EP group spans 2 "
        "NVLink domains, where each of the full job's stays inside one (allowed: a parallelism.order that keeps each "
        "EP group inside one NVLink domain on fewer replicas; or restart.min_replicas above 3)\n")


FAT_TREE = DP_INNERMOST_DGX.replace("parallelism: {", "parallelism: {tp: 2, ")


def test_the_split_group_refusal_holds_on_a_fat_tree_whose_hosts_are_its_nvlink_domains(tmp_path, capsys):
    """Not only racks: a DGX host is its own NVLink domain. DP innermost on 4 DGX H100 (a host per pipeline stage,
    TP groups (r, r + 4) in it); shrunk to 3 replicas a stage is 6 ranks and a TP group crosses hosts, onto
    InfiniBand every layer. Refused with its `min_replicas` advice; that advice (4, the layout's DP) validates,
    with a warning that the job then never shrinks, and the default order, whose TP groups stay in their hosts,
    runs on every size."""
    scenario = tmp_path / "job.yaml"
    scenario.write_text(FAT_TREE)
    assert main(["validate", str(scenario)]) == 2
    assert capsys.readouterr().err == (
        f"error: {scenario}:4: parallelism.tp: the elastic job shrunk to 3 replicas (3 hosts): a TP group spans 2 "
        "NVLink domains, where each of the full job's stays inside one (allowed: a parallelism.order that keeps each "
        "TP group inside one NVLink domain on fewer replicas; or restart.min_replicas above 3)\n")
    assert main(["validate", str(scenario), "--set", "restart.min_replicas=4"]) == 0
    default = tmp_path / "default.yaml"
    default.write_text(FAT_TREE.replace(", order: [dp, tp, cp, pp]", ""))
    loaded = scenario_from_text(default.read_text(), str(default))
    assert elastic_sizes(loaded, scenario_topology(loaded)).sizes == (1, 2, 3, 4)


@pytest.mark.parametrize("degrees", [(2, 1, 2, 4, 2), (1, 2, 1, 8, 4), (2, 2, 2, 2, 4), (4, 1, 1, 6, 3)])
def test_group_domains_are_the_most_domains_a_tp_and_an_ep_group_span(degrees):
    """`group_domains` against the groups the step builds (`Layout.group`, `ep_group`), rank by rank, for every
    dimension order and domains of 3 and 5 GPUs (groups straddling them)."""
    tp, cp, pp, dp, ep = degrees
    for order, domain in itertools.product(itertools.permutations(("tp", "cp", "pp", "dp")), (3, 5)):
        layout = Layout(tp=tp, cp=cp, pp=pp, dp=dp, order=order)
        domains = np.arange(layout.world) // domain
        domain_of = domains.tolist().__getitem__
        groups = {"tp": [layout.group("tp", rank) for rank in range(layout.world)],
                  "ep": [ep_group(layout, rank, ep) for rank in range(layout.world)]}
        expected = {name: max(len({domain_of(member) for member in group}) for group in members)
                    for name, members in groups.items()}
        assert group_domains(layout, ep, domains) == expected


def test_the_shrink_settings_of_nvl72_racks_write_the_shrunk_scenario():
    """`shrunk_settings` (what a shrunk size's memory remedies are weighed on) set the racks and last rack's trays
    the shrunk scenario keeps, never `nodes`: 3 of 8 one-tray replicas keep 3 trays of one rack."""
    loaded = scenario_from_text(job(), "job.yaml")
    topology = scenario_topology(loaded)
    settings = shrunk_settings(loaded.scenario, topology, 8, 2, 3)
    assert settings[:3] == ("cluster.racks=1", "cluster.last_rack_trays=3", "parallelism.dp=3")
    assert scenario_from_text(job(), "job.yaml", list(settings)).scenario == shrunk_scenario(
        loaded.scenario, topology, 8, 2, 3)
