"""An elastic job's smaller sizes, checked at load without building a cluster per size: each size's cluster is
refused by its builder's checks alone and its step resolved on the full cluster's first hosts
(`Topology.first_hosts`), to the same decisions as the clusters built (a 16,384-GPU job built 127 of them, for
20 s, saying nothing); and `trainsim validate` and `run` show the checks' progress."""

from __future__ import annotations

from dataclasses import replace

import pytest

import simulator.reliability.elastic as elastic
import simulator.topology.loader as topology_loader
from simulator import simulate
from simulator.cli import main
from simulator.config.loader import load_scenario, scenario_from_text
from simulator.console.progress import RunProgress
from simulator.errors import InputError
from simulator.reliability.elastic import check_sizes, elastic_sizes, group_domains, shrunk_scenario
from simulator.reliability.states import ClusterState, StepStates
from simulator.topology.graph import Topology
from simulator.topology.loader import scenario_topology
from simulator.workload.training import microbatch_count, pipeline_depth, resolve_layout

JOB = """model: {layers: 6, hidden: 12288, heads: 96, vocab: 32000}
training: {seq_len: 1024, microbatches: 1}
checkpoint: {interval: 1000 d}
storage: {capacity: 1 PB}
run: {horizon: 2 d, replications: 1, seed: 5}
restart: {elastic: true}
faults: {components: {gpu: {mtbf: 2 d, repair: 6 h}}}
"""
ONE_GPU_HOSTS = "{topology: dgx-h100-cluster, node: {kind: nvswitch_node, gpus: 1}, nics_per_node: 1, leaf_ports: 2"
CASES = {
    # ZeRO-3 over 12 one-GPU hosts: the smaller sizes' states outgrow the H100 (skipped for memory)
    "zero3-memory": f"cluster: {ONE_GPU_HOSTS}, nodes: 12}}\nparallelism: {{dp: 12, zero: 3}}\n",
    # three tiers of 3 pods over 2-host leaf groups: every size keeps the full fabric (it was refused where its
    # leaf groups, spread over the pods again, left one empty)
    "three-tier-pods": f"cluster: {ONE_GPU_HOSTS}, nodes: 12, tiers: 3, pods: 3}}\n"
                       "parallelism: {dp: 12, zero: 3}\n",
    # DP inside the hosts: a TP group of the shrunk job spans two hosts where the full job's stayed in one
    "split-tp-groups": "cluster: {topology: dgx-h100-cluster, nodes: 4}\n"
                       "parallelism: {tp: 2, pp: 4, dp: 4, order: [dp, tp, cp, pp]}\n",
    # GB200 racks of 4 trays: a shrunk job keeps whole racks, then a last rack of the trays left
    "nvl72-trays": "cluster: {topology: gb200-nvl72, racks: 3, trays: 4, leaf_ports: 4, spines: 2}\n"
                   "parallelism: {tp: 4, dp: 12}\n",
}


def _job(case: str):
    text = JOB + CASES[case]
    if case in ("split-tp-groups", "nvl72-trays"):
        text = text.replace("layers: 6, hidden: 12288, heads: 96", "layers: 8, hidden: 2048, heads: 16")
    loaded = scenario_from_text(text, "job.yaml")
    return loaded, scenario_topology(loaded)


def _decisions(loaded, topology) -> dict[int, object]:
    """Each smaller size's check: (peak memory per GPU, the GPU's) in bytes, or its refusal's text."""
    scenario = loaded.scenario
    layout = resolve_layout(scenario, topology.num_gpus, pipeline_depth(scenario))
    microbatches = microbatch_count(scenario, layout.dp)
    spans = group_domains(layout, scenario.parallelism.ep, topology.gpu_domain_array)
    file = topology_loader.scenario_topology_file(loaded)
    decisions: dict[int, object] = {}
    for size in range(1, layout.dp):
        try:
            decisions[size] = elastic._check_size(loaded, topology, file, layout.dp, microbatches, size, spans)
        except InputError as error:
            decisions[size] = str(error)
    return decisions


def _built(monkeypatch):
    """Check every size on its cluster built: the reference the builders' checks without building are held to."""
    monkeypatch.setattr(elastic, "scenario_topology_checked", lambda shrunk, file=None: False)


@pytest.mark.parametrize("case", CASES)
def test_each_size_is_decided_as_on_its_cluster_built(case, monkeypatch):
    """Every smaller size of each job gets the same peak memory, GPU capacity and refusal text as when its
    cluster is built, and the job the same sizes; the cases reach each decision: sizes that fit, sizes skipped
    for memory, sizes whose three-tier fabric cannot be built, sizes whose TP groups leave NVLink domains."""
    loaded, topology = _job(case)
    fast = _decisions(loaded, topology)
    fast_sizes = _sizes_or_refusal(loaded, topology)
    _built(monkeypatch)
    assert fast == _decisions(loaded, topology)
    assert fast_sizes == _sizes_or_refusal(loaded, topology)
    kinds = {"refused" if isinstance(decision, str) else "out of memory" if decision[0] > decision[1] else "fits"
             for decision in fast.values()}
    assert kinds == {"zero3-memory": {"fits", "out of memory"}, "three-tier-pods": {"fits", "out of memory"},
                     "split-tp-groups": {"fits", "refused"}, "nvl72-trays": {"fits"}}[case]


def _sizes_or_refusal(loaded, topology):
    try:
        return check_sizes(loaded, topology)
    except InputError as error:
        return str(error)


@pytest.mark.parametrize("case", ["zero3-memory", "nvl72-trays"])
def test_the_sizes_are_checked_without_building_a_cluster_per_size(case, monkeypatch):
    """The fat tree's and the NVL72 racks' builders check their parameters without building, so no cluster is built for
    the 11 smaller sizes (building one per size, a 16,384-GPU job's 127 would take 20 s); their GPUs are the full
    cluster's first hosts, with the NVLink domains of the cluster built."""
    loaded, topology = _job(case)
    built = []
    monkeypatch.setattr(topology_loader, "build_topology", lambda *args: built.append(args))
    sizes = check_sizes(loaded, topology)
    assert built == [] and len(sizes.sizes) + len(sizes.out_of_memory) == 12
    monkeypatch.undo()
    for size in (1, 5, 7):
        shrunk = replace(loaded, scenario=shrunk_scenario(loaded.scenario, topology, 12, 1, size))
        cluster = scenario_topology(shrunk)
        first = topology.first_hosts(cluster.num_hosts)
        assert (first.gpus, first.gpu_host, first.gpu_local, first.gpu_domain, first.gpu_model) == (
            cluster.gpus, cluster.gpu_host, cluster.gpu_local, cluster.gpu_domain, cluster.gpu_model)


def test_the_size_checks_report_their_progress():
    """`elastic_sizes` tells its ``progress`` each smaller size checked, largest first, out of all of them."""
    loaded, topology = _job("zero3-memory")
    heard = []
    elastic._CHECKED.clear()
    elastic_sizes(loaded, topology, lambda done, total: heard.append((done, total)))
    assert heard == [(done, 11) for done in range(1, 12)]


def test_a_passing_count_leaves_the_progress_once_done(capsys):
    """The sizes' count leaves the plain line once every size is checked (it read 'checking elastic sizes'
    through the healthy step simulated next); a count that is not passing stays."""
    with RunProgress(enabled=True, unit="replications", description="simulating the job") as progress:
        assert progress.plain is not None
        sizes = progress.counting("sizes", "checking elastic sizes", passing=True)
        sizes(5, 11)
        assert progress.status.line(0) == "checking elastic sizes: 5/11 sizes (45%), 0:00:00 elapsed"
        sizes(11, 11)
        assert progress.status.line(0) == "simulating the job: 0:00:00 elapsed"
        progress.counting("states", "simulating cluster states ahead")(3, 3)
        assert progress.status.counts == (3, 3, "states", "simulating cluster states ahead")
    capsys.readouterr()


@pytest.mark.parametrize("quiet", [False, True])
def test_validate_shows_the_size_checks_off_a_terminal_unless_quiet(quiet, tmp_path, capsys, monkeypatch):
    """`trainsim validate` of an elastic job prints the plain progress line of its size checks on stderr when
    one is due (here every check: PLAIN_EVERY_S set to 0), none with --quiet; its output is the same."""
    import simulator.console.progress as progress_module

    monkeypatch.setattr(progress_module, "PLAIN_EVERY_S", 0.0)
    monkeypatch.setattr(progress_module, "BEAT_S", 86_400.0)
    scenario = tmp_path / "job.yaml"
    scenario.write_text(JOB + CASES["zero3-memory"])
    elastic._CHECKED.clear()
    assert main(["validate", str(scenario), *(["--quiet"] if quiet else [])]) == 0
    captured = capsys.readouterr()
    lines = [line.rsplit(",", 1)[0] for line in captured.err.splitlines() if line.startswith("checking")]
    assert lines == ([] if quiet else [f"checking elastic sizes: {done}/11 sizes ({done * 100 // 11}%)"
                                       for done in range(1, 12)])
    assert ("elastic sizes: " in captured.out) is not quiet


GRAPH_HOSTS = """kind: graph
nodes:
  - {name: g0, kind: gpu, host: 0}
  - {name: g1, kind: gpu, host: 1}
  - {name: g2, kind: gpu, host: 2}
  - {name: g3, kind: gpu, host: 3}
  - {name: sw, kind: switch}
links:
""" + "".join(f"  - {{a: g{gpu}, b: sw, bandwidth: 400 Gb/s, latency: 5 us, class: infiniband}}\n"
              for gpu in range(4)) + "rails: 1\ngpu_model: h100-sxm\n"


@pytest.mark.parametrize("min_replicas", ["", "restart: {elastic: true, min_replicas: 4}\n"])
def test_an_elastic_job_on_an_explicit_graph_is_refused_at_restart_elastic(min_replicas, tmp_path, capsys):
    """A shrunk job's cluster is its topology rebuilt on fewer hosts, which a `kind: graph` topology cannot be: an
    elastic job on one is refused at the line that asked for elastic, not at `cluster.nodes`, a field the user never
    wrote. With `min_replicas` at the layout's size it never shrinks, and runs on the graph."""
    (tmp_path / "graph4.yaml").write_text(GRAPH_HOSTS)
    scenario = tmp_path / "job.yaml"
    scenario.write_text("cluster: {topology: graph4.yaml}\nparallelism: {dp: 4}\n" + JOB.replace(
        "restart: {elastic: true}\n", min_replicas or "restart: {elastic: true}\n").replace(
        "hidden: 12288, heads: 96", "hidden: 1024, heads: 8"))
    if min_replicas:
        assert main(["validate", str(scenario), "--quiet"]) == 0
        return
    assert main(["validate", str(scenario)]) == 2
    line = next(number for number, text in enumerate(scenario.read_text().splitlines(), 1) if "elastic" in text)
    assert capsys.readouterr().err == (
        f"error: {scenario}:{line}: restart.elastic: the elastic job of 4 replicas shrinks to as few as 1 by "
        "rebuilding its topology on fewer hosts, and graph4 is an explicit graph (kind: graph), which has no host "
        "count to rebuild it with (allowed: restart.elastic: false, or a topology built from parameters (kind: "
        "cluster or nvl72))\n")


THREE_TIERS = {
    # one-GPU hosts, 6 leaf groups of 2 in 3 pods: 11 smaller sizes, down to one host
    "one-gpu-hosts": ("{topology: dgx-h100-cluster, node: {kind: nvswitch_node, gpus: 1}, nics_per_node: 1, "
                      "leaf_ports: 2, nodes: 12, tiers: 3, pods: 3}", "dp: 12"),
    # two-GPU hosts on two rails, 5 leaf groups in 3 pods of 2, 2 and 1 (the last pod's core links thinner)
    "rails-partial-pod": ("{topology: dgx-h100-cluster, node: {kind: nvswitch_node, gpus: 2}, nics_per_node: 2, "
                          "leaf_ports: 2, nodes: 10, tiers: 3, pods: 3, cores: 2}", "tp: 2, dp: 10"),
    # GB200 racks of 4 trays, 6 leaf groups of 2 trays in 2 pods: shrunk by trays, then by racks
    "nvl72-racks": ("{topology: gb200-nvl72, racks: 3, trays: 4, leaf_ports: 2, spines: 2, tiers: 3, pods: 2}",
                    "tp: 4, dp: 12"),
}


def _three_tier_job(case: str, sizes: str = "") -> str:
    cluster, parallelism = THREE_TIERS[case]
    return JOB.replace("layers: 6, hidden: 12288, heads: 96", "layers: 2, hidden: 2048, heads: 16") + (
        f"cluster: {cluster[:-1]}{sizes}}}\nparallelism: {{{parallelism}}}\n")


def _kept_wiring(full: Topology, hosts: int) -> tuple[list, list]:
    """``full``'s nodes and links (with their attributes, in order) less those of its hosts from ``hosts`` on:
    their GPUs, NICs and switches (an NVL72 rack's with none of its trays kept) and every link to them."""
    domains = set(full.gpu_domain[:len([host for host in full.gpu_host if host < hosts])])
    kept = {name for name, attributes in full.wiring.nodes.items()
            if attributes.get("host", -1) < hosts and attributes.get("nvlink_domain", min(domains)) in domains}
    return ([item for item in full.wiring.nodes.items() if item[0] in kept],
            [item for item in full.wiring.edges.items() if kept.issuperset(item[0])])


@pytest.mark.parametrize("case", THREE_TIERS)
def test_a_shrunk_three_tier_cluster_is_the_full_one_cut_to_its_kept_hosts(case):
    """Every smaller size's cluster is the full one's nodes and links, attributes and order included, less the hosts
    given up and their links: each leaf group stays in its pod, every leaf, spine and core stays, the spine-core
    links keep their bandwidth. A lone rack left has no network (as with two tiers), so only sizes on two racks or
    more are compared there."""
    loaded = scenario_from_text(_three_tier_job(case), "job.yaml")
    full = scenario_topology(loaded)
    layout = resolve_layout(loaded.scenario, full.num_gpus, pipeline_depth(loaded.scenario))
    compared = 0
    for size in range(1, layout.dp):
        shrunk = replace(loaded, scenario=shrunk_scenario(loaded.scenario, full, layout.dp, 1, size))
        cluster = scenario_topology(shrunk)
        if not any(attributes.get("kind") == "nic" for attributes in cluster.wiring.nodes.values()):
            assert case == "nvl72-racks" and cluster.num_hosts <= 4
            continue
        assert (list(cluster.wiring.nodes.items()), list(cluster.wiring.edges.items())) == _kept_wiring(
            full, cluster.num_hosts)
        compared += 1
    assert compared == {"nvl72-racks": 7}.get(case, layout.dp - 1)


def test_the_gb200_job_on_three_tiers_shrinks_to_16_replicas():
    """llama3-70b-gb200-job on 3 pods of 8-tray leaf groups (9 groups, 3 per pod): at 16 replicas its 32 trays make 4
    leaf groups, which rebuilt over 3 pods would leave a pod empty. Cut from the full fabric, it runs on every size
    whose step fits (1 replica does not: out of memory)."""
    loaded = load_scenario("llama3-70b-gb200-job", ["cluster.tiers=3", "cluster.pods=3", "cluster.leaf_ports=8"])
    sizes = check_sizes(loaded, scenario_topology(loaded))
    assert sizes.sizes == tuple(range(2, 37)) and [size for size, _ in sizes.out_of_memory] == [1]


@pytest.mark.filterwarnings("ignore:.*runs one training step and ignores the job's:UserWarning")
def test_a_shrunk_three_tier_step_is_a_plain_simulation_of_the_cut_cluster():
    """The job shrunk to 5 of its 10 two-GPU hosts (leaf groups 0 and 1 in pod 0, host 4 alone in pod 1's first
    group) steps as `simulate()` of the scenario written for that cut cluster (`nodes: 5, fabric_hosts: 10`),
    to the bit, folded and unfolded; and the folded step (fewer ranks simulated) is the unfolded one to the
    bit, so folding stays exact on the cut fabric."""
    def folding(text: str, fold: str) -> str:
        return text.replace("run: {horizon", f"run: {{fold: {fold}, horizon")

    cut = _three_tier_job("rails-partial-pod", ", fabric_hosts: 10").replace("nodes: 10", "nodes: 5").replace(
        "dp: 10", "dp: 5")
    alone = {}
    for fold in ("true", "false"):
        loaded = scenario_from_text(folding(_three_tier_job("rails-partial-pod"), fold), "job.yaml")
        step = StepStates(loaded, scenario_topology(loaded))(ClusterState(5))
        alone[fold] = simulate(scenario_from_text(folding(cut, fold), "job.yaml")).summary
        assert step is not None and step.step_s == alone[fold]["step_time_s"]
    assert alone["true"]["step_time_s"] == alone["false"]["step_time_s"]
    assert alone["true"]["simulated_ranks"] < alone["false"]["simulated_ranks"]
