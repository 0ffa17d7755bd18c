"""Where a straggler is simulated while links or NVSwitch trays are down: whole units of replicas (filling hosts
and NVLink domains) trade places, the k-th untouched one holding a straggler becoming the k-th untouched one, each
straggler keeping its place inside it, where that is exact (the steps are equal to the bit); its own GPU in a
touched unit, without data parallelism outermost, or with experts split. A shrunk elastic job places them by its
own layout, and nowhere when their GPU is beyond the job's GPUs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from shared import THROTTLE_CLASSES, H, gb200_job

from simulator import simulate
from simulator.config.faults import LinkFault, StepFaults, Straggler
from simulator.config.loader import LoadedScenario, scenario_from_text
from simulator.reliability.perturbed import with_step_faults
from simulator.reliability.states import ClusterState, Degradation, StepStates, nvswitch_tray_faults
from simulator.topology.loader import scenario_topology

pytestmark = pytest.mark.filterwarnings("ignore:.*runs one training step and ignores the job's:UserWarning")

GB200_THROTTLE = gb200_job(THROTTLE_CLASSES)
"""TP 4 x DP 8 on 2 GB200 racks of 4 trays (16 GPUs each), a replica per tray, with a tray and a throttle class."""

DGX_LEAF_GROUPS = """cluster: {topology: dgx-h100-cluster, nodes: 6, leaf_ports: 2, spines: 2}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 2}
parallelism: {tp: 8, dp: 6}
"""
"""TP 8 x DP 6 on 6 DGX H100, a replica per host, 3 leaf groups of 2 hosts."""


def step_with(loaded: LoadedScenario, links: tuple[LinkFault, ...], gpu: int) -> float:
    """The step of ``loaded`` with ``links`` degraded and GPU ``gpu`` x1.5."""
    return steps_with(loaded, links, (gpu,))


def stand_in(states: StepStates, degradation: Degradation, gpu: int) -> int:
    """The GPU the state with ``degradation`` and GPU ``gpu`` x1.5 slows."""
    state = states.state_of(states.healthy.replicas, [degradation, Degradation(gpus=(gpu,), slowdown=1.5)])
    ((slow, factor),) = state.slow_gpus
    assert factor == 1.5
    return slow


@pytest.mark.parametrize("down", [1, 7])
@pytest.mark.parametrize("rack", [0, 1])
def test_a_straggler_beside_trays_down_keeps_its_gpu_where_no_whole_rack_may_stand_in(rack, down):
    """2 GB200 racks of 4 trays, TP 4 x DP 8, ``down`` NVSwitch trays of one rack down: replicas trade places only
    as whole NVLink domains (racks), and the one rack the trays spare is the first such, so every x1.5 GPU keeps its
    own place (7 trays: GPU 16 and 28 give 12.5767 ms, GPU 20 12.5772 ms, a rack-0 GPU 11.9246 ms)."""
    loaded = scenario_from_text(GB200_THROTTLE, "job.yaml")
    switch = f"rack{rack}/nvswitch"
    states = StepStates(loaded, scenario_topology(loaded))
    trays = [Degradation(nvswitch_tray=(switch, tray)) for tray in range(down)]
    for gpu in (0, 5, 13, 15, 16, 20, 22, 29):
        state = states.state_of(states.healthy.replicas, [*trays, Degradation(gpus=(gpu,), slowdown=1.5)])
        assert state.slow_gpus == ((gpu, 1.5),)


@pytest.mark.parametrize(("unit", "touched", "stand_ins"), [
    ("h1/nic2", {1}, {0: 0, 10: 10, 8: 8, 21: 5, 44: 4}),
    ("leaf0.r0", {0, 1}, {2: 2, 8: 8, 16: 16, 27: 19, 41: 17})])
def test_a_straggler_on_a_host_a_link_down_spares_stands_in_to_the_bit(unit, touched, stand_ins):
    """6 DGX H100 hosts in 3 leaf groups, TP 8 x DP 6: with host 1's NIC 2 down, a x1.5 GPU on another host
    (in host 1's leaf group or not) is simulated on host 0's GPU of its TP lane (rail); with leaf group 0's
    rail-0 leaf down, one on hosts 2 to 5 on host 2's; either's step the real GPU's to the bit. Links down
    tell rails apart: GPU 16 (rail 0) gives 16.083 ms, GPU 19 (rail 3) another. One on a host the link down
    touches keeps its GPU (GPU 2 of host 0 under the leaf down, 15.934 ms)."""
    loaded = scenario_from_text(DGX_LEAF_GROUPS, "job.yaml")
    topology = scenario_topology(loaded)
    down = tuple(edge for edge in topology.wiring.edges if unit in edge)
    links = tuple(LinkFault(link=edge) for edge in down)
    states = StepStates(loaded, topology)
    assert states.touched_replicas(down, ()) == touched
    for gpu, expected in stand_ins.items():
        assert stand_in(states, Degradation(links=down), gpu) == expected
        if gpu != expected:
            assert step_with(loaded, links, gpu) == step_with(loaded, links, expected)
    if unit.startswith("leaf"):
        assert step_with(loaded, links, 2) != step_with(loaded, links, 16) != step_with(loaded, links, 19)


def steps_with(loaded: LoadedScenario, links: tuple[LinkFault, ...], gpus: tuple[int, ...]) -> float:
    """The step of ``loaded`` with ``links`` degraded and ``gpus`` x1.5."""
    stragglers = tuple(Straggler(gpus=(gpu,), slowdown=1.5) for gpu in gpus)
    return simulate(with_step_faults(loaded, StepFaults(links=links, stragglers=stragglers))).summary["step_time_s"]


DGX_PP = """cluster: {topology: dgx-h100-cluster, nodes: 8, leaf_ports: 2, spines: 2}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {tp: 8, pp: 2, dp: 4}
"""
"""TP 8 x PP 2 x DP 4 on 8 DGX H100, a replica per 2 hosts (a stage per host)."""

GB200_PP = """cluster: {topology: gb200-nvl72, racks: 2, trays: 4, leaf_ports: 4, spines: 2}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {tp: 4, pp: 2, dp: 4}
"""
"""TP 4 x PP 2 x DP 4 on 2 GB200 racks of 4 trays, 2 replicas per rack."""

MOE_EP2 = """cluster: {topology: dgx-h100-cluster, nodes: 6, leaf_ports: 2, spines: 2}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000, moe: {experts: 12, top_k: 2}}
training: {seq_len: 1024, microbatches: 2}
parallelism: {tp: 8, dp: 6, ep: 2}
"""
"""TP 8 x DP 6 x EP 2 on 6 DGX H100: EP groups of 2 replicas (hosts 0-1, 2-3, 4-5)."""


def degraded(topology, down: str) -> tuple[list[Degradation], tuple[LinkFault, ...]]:
    """The degradations and step faults of ``down``: a rack's NVSwitch node (7 trays down) or a NIC or leaf."""
    if down.endswith("nvswitch"):
        return ([Degradation(nvswitch_tray=(down, tray)) for tray in range(7)],
                nvswitch_tray_faults(topology, ((down, 7),)))
    edges = tuple(edge for edge in topology.wiring.edges if down in edge)
    return [Degradation(links=edges)], tuple(LinkFault(link=edge) for edge in edges)


def _state_with_stragglers(text: str, down: str, gpus: tuple[int, ...]
                           ) -> tuple[LoadedScenario, ClusterState, tuple[LinkFault, ...]]:
    """The scenario, the state its job meets with ``down`` out and ``gpus`` slowed 1.5x, and the links down."""
    loaded = scenario_from_text(text, "job.yaml")
    topology = scenario_topology(loaded)
    states = StepStates(loaded, topology)
    degradations, links = degraded(topology, down)
    slowed = [Degradation(gpus=(gpu,), slowdown=1.5) for gpu in gpus]
    return loaded, states.state_of(states.healthy.replicas, [*degradations, *slowed]), links


@pytest.mark.parametrize(("text", "down", "gpus", "stand_ins"), [
    (DGX_LEAF_GROUPS, "leaf0.r0", (24, 41), (16, 25)),
    (DGX_LEAF_GROUPS, "leaf0.r0", (2, 40), (2, 16)),
    (DGX_PP, "h2/nic0", (40, 48), (8, 32))])
def test_several_stragglers_stand_in_replica_by_replica_to_the_bit(text, down, gpus, stand_ins):
    """Stragglers on untouched replicas trade places replica by replica, the k-th untouched replica holding one
    becoming the k-th untouched replica, each keeping its stage and lane: under leaf 0's rail 0 down (hosts 0 and
    1), GPUs 24 and 41 (hosts 3 and 5) stand in on hosts 2 and 3 (16 and 25); beside host 2's NIC down (replica 1 of
    TP 8 x PP 2 x DP 4), GPUs 40 and 48 (replicas 2 and 3) on replicas 0 and 2. The step is the real GPUs' to the
    bit."""
    loaded, state, links = _state_with_stragglers(text, down, gpus)
    assert state.slow_gpus == tuple((gpu, 1.5) for gpu in stand_ins)
    assert steps_with(loaded, links, gpus) == steps_with(loaded, links, stand_ins)


@pytest.mark.parametrize(("text", "down", "gpus"), [
    (GB200_PP, "rack1/nvswitch", (4, 8)),
    (GB200_THROTTLE, "rack1/nvswitch", (13, 20)),
    (DGX_LEAF_GROUPS.replace("dp: 6", "cp: 2, dp: 6, order: [tp, dp, cp, pp]").replace("tp: 8", "tp: 4")
     .replace("seq_len: 1024", "seq_len: 2048"), "h1/nic5", (21, 45)),
    (MOE_EP2, "h1/nic2", (26, 42))])
def test_stragglers_keep_their_gpus_where_no_whole_unit_stands_in(text, down, gpus):
    """Stragglers keep their GPUs where no untouched unit precedes theirs (GB200: the rack is the unit, and rack 0
    the first the trays of rack 1 spare), where data parallelism is not the outermost dimension (`order: [tp, dp,
    cp, pp]`: a replica's lane is no physical place), and where experts are split (EP 2: EP groups are not alike:
    GPU 42 gives a step 1.9e-4 shorter than GPU 26)."""
    _, state, _ = _state_with_stragglers(text, down, gpus)
    assert state.slow_gpus == tuple((gpu, 1.5) for gpu in gpus)


DGX_STRADDLING = """cluster: {topology: dgx-h100-cluster, nodes: 12, leaf_ports: 3, spines: 2}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 4}
parallelism: {tp: 8, pp: 2, dp: 6}
"""
"""TP 8 x PP 2 x DP 6 on 12 DGX H100 in 4 leaf groups of 3 hosts: replica 1 (hosts 2-3) and replica 4 (hosts
8-9) each straddle two leaf groups."""


@pytest.mark.parametrize(("down", "gpu"), [("leaf1.r0", 64), ("h4/nic0", 64), ("leaf1.r5", 72), ("", 64), ("", 72)])
def test_stragglers_keep_their_gpus_where_replicas_straddle_leaf_groups(down, gpu):
    """Replicas of 2 hosts over leaf groups of 3: the fewest whole replicas that lie inside leaf groups or hold
    whole ones are 3 (half the job), the other half touched, so with leaf group 1's leaf or host 4's NIC down a x1.5
    GPU of replica 4 keeps its place, and with nothing down too."""
    loaded = scenario_from_text(DGX_STRADDLING, "job.yaml")
    topology = scenario_topology(loaded)
    states = StepStates(loaded, topology)
    degradations = degraded(topology, down)[0] if down else []
    state = states.state_of(states.healthy.replicas, [*degradations, Degradation(gpus=(gpu,), slowdown=1.5)])
    ((slow, _),) = state.slow_gpus
    assert slow == gpu


def test_a_job_keeps_the_gpus_of_stragglers_no_whole_rack_stands_in_for(job_with):
    """A tray of rack 1 down from 1 h to 6 h; GPUs 4, 9 and 13 (rack 0) then 20 (rack 1) throttled x1.5 half an hour
    each in turn: the job's states with the tray down keep each straggler's GPU (rack 0 is the first rack the tray
    spares)."""
    rows = [(1 * H, 0, 13, 5 * H)] + [((1.5 + start) * H, 1, gpu, 0.5 * H)
                                       for start, gpu in ((0, 4), (1, 9), (2, 13), (3, 20))]
    summary = job_with(GB200_THROTTLE, *rows).summary
    both = [state for state in summary["states"] if state["nvswitch_trays_down"] and state["slow_gpus"]]
    assert [state["slow_gpus"] for state in both] == [{"4": 1.5}, {"9": 1.5}, {"13": 1.5}, {"20": 1.5}]


ELASTIC_NIC = """cluster: {topology: dgx-h100-cluster, nodes: 4, leaf_ports: 2, spines: 2}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 2}
parallelism: {tp: 8, dp: 4}
checkpoint: {interval: 30 min}
storage: {capacity: 1 PB}
run: {horizon: 12 h}
faults:
  components:
    gpu: {mtbf: 1000 d, repair: 10 h}
    nic: {mtbf: 1000 d, repair: 4 h, effect: degrade}
    throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 1000 d, repair: 4 h}
restart: {detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0, elastic: true}
"""
"""TP 8 x DP 4 on 4 DGX H100 hosts, elastic, no spares: a GPU failure shrinks it to 3 replicas (hosts 0-2)."""


def test_a_straggler_beyond_a_shrunk_job_slows_nothing_with_or_without_links_down(job_with):
    """GPU 30 (host 3) throttled x1.5 from 0.5 h to 8.5 h; host 1 fails at 1 h (the job shrinks to 3 replicas, GPUs
    0-23, for the rest of the run); host 0's NIC 0 is down from 2 h to 6 h. The shrunk states with the throttle are
    those without it: no GPU slowed, with the NIC down and without."""
    summary = job_with(ELASTIC_NIC, (0.5 * H, 2, 30, 8 * H), (1 * H, 0, 8, 10 * H), (2 * H, 1, 0, 4 * H)).summary
    shrunk = [state for state in summary["states"] if state["replicas"] == 3]
    assert [(bool(state["links_down"]), state["slow_gpus"]) for state in shrunk] == [(False, {}), (True, {})]


SHRUNK_PP_INNER = DGX_PP.replace("dp: 4}", "dp: 4, order: [tp, cp, dp, pp]}")
"""TP 8 x PP 2 x DP 4 on 8 DGX H100 with the stages outermost: shrunk to 3 replicas, stage 0 is GPUs 0-23 and
stage 1 GPUs 24-47, where on 4 replicas stage 1 starts at GPU 32."""


@pytest.mark.parametrize(("leaf_ports", "stand_in_of_40"), [(8, 24), (2, 40)])
def test_a_shrunk_job_places_stragglers_by_its_own_layout(leaf_ports, stand_in_of_40):
    """On 3 of 4 replicas (`order: [tp, cp, dp, pp]`), GPU 24 is a stage-1 GPU of the shrunk job: without links down
    it stands in on that stage's first GPU (24), as GPU 40 does where every replica lies in one leaf group
    (`leaf_ports: 8`); with leaf groups of 2 hosts replica 0 (hosts 0 and 3) straddles two, so GPU 40 keeps its
    place. Beside host 0's NIC down GPU 24 keeps its GPU (replicas trade places only with data parallelism
    outermost). Each state's step is the real GPU's to the bit; its exposed network share, a mean over the 48
    ranks taken with the slow rank elsewhere in the sum, within float rounding (0.36254650915017367 against
    ...736 on `leaf_ports: 8`)."""
    loaded = scenario_from_text(SHRUNK_PP_INNER.replace("leaf_ports: 2", f"leaf_ports: {leaf_ports}"), "job.yaml")
    topology = scenario_topology(loaded)
    states = StepStates(loaded, topology)
    nic, _ = degraded(topology, "h0/nic0")
    for gpu, stand_in_gpu in ((24, 24), (40, stand_in_of_40)):
        state = states.state_of(3, [Degradation(gpus=(gpu,), slowdown=1.5)])
        assert state.slow_gpus == ((stand_in_gpu, 1.5),)
        stood, real = states(state), states(ClusterState(3, slow_gpus=((gpu, 1.5),)))
        assert stood is not None and real is not None
        assert replace(stood, exposed_network_share=real.exposed_network_share) == real
        assert stood.exposed_network_share == pytest.approx(real.exposed_network_share, rel=1e-15)
    assert states.state_of(3, [*nic, Degradation(gpus=(24,), slowdown=1.5)]).slow_gpus == ((24, 1.5),)
