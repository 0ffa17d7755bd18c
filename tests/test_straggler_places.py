"""Where a straggler is simulated while links or NVSwitch trays are down: on the first GPU of its pipeline stage in
the replicas no degradation touches when it sits in one of them (those GPUs are alike: the steps are equal to the
bit), on its own GPU when its replica is touched; and on a shrunk elastic job, nowhere when its GPU is beyond the
job's GPUs."""

from __future__ import annotations

import pytest

from simulator import simulate
from simulator.config.faults import LinkFault, StepFaults, Straggler
from simulator.config.loader import LoadedScenario, scenario_from_text
from simulator.reliability.perturbed import with_step_faults
from simulator.reliability.states import Degradation, StepStates, nvswitch_tray_faults
from simulator.topology.loader import scenario_topology

H = 3600.0

pytestmark = pytest.mark.filterwarnings("ignore:.*runs one training step and ignores the job's:UserWarning")

GB200_THROTTLE = """cluster: {topology: gb200-nvl72, racks: 2, trays: 4, leaf_ports: 4, spines: 2}
model: {layers: 4, hidden: 2048, heads: 16, vocab: 32000}
training: {seq_len: 1024, microbatches: 2}
parallelism: {tp: 4, dp: 8}
checkpoint: {interval: 30 min}
storage: {capacity: 1 PB}
run: {horizon: 12 h}
faults:
  components:
    nvswitch_tray: {mtbf: 1000 d, repair: 2 h}
    throttle: {unit: gpu, effect: straggle, slowdown: 1.5, mtbf: 1000 d, repair: 2 h}
restart: {detection: 1 min, reschedule: 0 s, launch: 0 s, warmup_steps: 0, elastic: true}
"""
"""TP 4 x DP 8 on 2 GB200 racks of 4 trays (16 GPUs each), a replica per tray (tests/test_nvl72_rack_faults.py's
job with its tray and throttle classes)."""

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
@pytest.mark.parametrize(("rack", "stand_ins"), [
    (1, {0: 0, 5: 0, 13: 0, 15: 0, 16: 16, 20: 20, 28: 28}),
    (0, {16: 16, 22: 16, 29: 16, 4: 4})])
def test_a_straggler_on_a_rack_the_trays_spare_stands_in_on_its_first_gpu_to_the_bit(rack, stand_ins, down):
    """2 GB200 racks of 4 trays, TP 4 x DP 8, ``down`` NVSwitch trays of one rack down: a x1.5 GPU on the other
    rack is simulated on that rack's first GPU, whatever its TP lane (the trays degrade every GPU of their rack
    alike), whose step is the real GPU's to the bit (1 and 7 trays); one on the rack with trays down keeps its
    GPU, which differs (7 trays: GPU 16 and 28 give 12.5767 ms, GPU 20 12.5772 ms, a rack-0 GPU 11.9246 ms).
    Before, a straggler kept its GPU while a tray was down (a state per GPU slowed)."""
    loaded = scenario_from_text(GB200_THROTTLE, "job.yaml")
    switch = f"rack{rack}/nvswitch"
    links = nvswitch_tray_faults(scenario_topology(loaded), ((switch, down),))
    states = StepStates(loaded, scenario_topology(loaded))
    trays = [Degradation(nvswitch_tray=(switch, tray)) for tray in range(down)]
    for gpu, expected in stand_ins.items():
        state = states.state_of(states.healthy.replicas, [*trays, Degradation(gpus=(gpu,), slowdown=1.5)])
        assert state.slow_gpus == ((expected, 1.5),)
        assert step_with(loaded, links, gpu) == step_with(loaded, links, expected)
    assert step_with(loaded, links, 16) != step_with(loaded, links, 0)


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
        assert step_with(loaded, links, gpu) == step_with(loaded, links, expected)
    if unit.startswith("leaf"):
        assert step_with(loaded, links, 2) != step_with(loaded, links, 16) != step_with(loaded, links, 19)


def steps_with(loaded: LoadedScenario, links: tuple[LinkFault, ...], gpus: tuple[int, ...]) -> float:
    """The step of ``loaded`` with ``links`` degraded and ``gpus`` x1.5."""
    stragglers = tuple(Straggler(gpus=(gpu,), slowdown=1.5) for gpu in gpus)
    return simulate(with_step_faults(loaded, StepFaults(links=links, stragglers=stragglers))).summary["step_time_s"]


@pytest.mark.parametrize(("text", "down", "gpus", "stand_ins"), [
    (GB200_THROTTLE, "rack1/nvswitch", (4, 9), (0,)),
    (GB200_THROTTLE, "rack1/nvswitch", (13, 20), (0, 20)),
    (DGX_LEAF_GROUPS, "leaf0.r0", (24, 41), (16, 17)),
    (DGX_LEAF_GROUPS, "leaf0.r0", (2, 40), (2, 16))])
def test_several_stragglers_stand_in_together_to_the_bit(text, down, gpus, stand_ins):
    """Stragglers on untouched replicas of one lane stand in as one GPU (rack 0's GPUs 4 and 9 beside 7 trays of
    rack 1 down: GPU 0), beside one that keeps its place (GPU 20 on rack 1); under a leaf down, each lane's
    their own (GPUs 24 and 41: 16 and 17). The step is the real GPUs' to the bit."""
    loaded = scenario_from_text(text, "job.yaml")
    topology = scenario_topology(loaded)
    states = StepStates(loaded, topology)
    if down.endswith("nvswitch"):
        links = nvswitch_tray_faults(topology, ((down, 7),))
        degradations = [Degradation(nvswitch_tray=(down, tray)) for tray in range(7)]
    else:
        edges = tuple(edge for edge in topology.wiring.edges if down in edge)
        links = tuple(LinkFault(link=edge) for edge in edges)
        degradations = [Degradation(links=edges)]
    slowed = [Degradation(gpus=(gpu,), slowdown=1.5) for gpu in gpus]
    state = states.state_of(states.healthy.replicas, [*degradations, *slowed])
    assert state.slow_gpus == tuple((gpu, 1.5) for gpu in stand_ins)
    assert steps_with(loaded, links, gpus) == steps_with(loaded, links, stand_ins)


def test_stragglers_on_the_rack_the_trays_spare_make_one_state(job_with):
    """A tray of rack 1 down from 1 h to 6 h; GPUs 4, 9 and 13 (rack 0) then 20 (rack 1) throttled x1.5 half an
    hour each in turn: the states with the tray down and a straggler are GPU 0's (rack 0's three) and GPU 20's,
    each the step of its real GPUs to the bit. Before, one state per GPU: 4."""
    rows = [(1 * H, 0, 13, 5 * H)] + [((1.5 + start) * H, 1, gpu, 0.5 * H)
                                       for start, gpu in ((0, 4), (1, 9), (2, 13), (3, 20))]
    summary = job_with(GB200_THROTTLE, *rows).summary
    loaded = scenario_from_text(GB200_THROTTLE, "job.yaml")
    links = nvswitch_tray_faults(scenario_topology(loaded), (("rack1/nvswitch", 1),))
    both = [state for state in summary["states"] if state["nvswitch_trays_down"] and state["slow_gpus"]]
    assert [state["slow_gpus"] for state in both] == [{"0": 1.5}, {"20": 1.5}]
    assert [state["step_time_s"] for state in both] == [step_with(loaded, links, 9), step_with(loaded, links, 20)]


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
    """GPU 30 (host 3) throttled x1.5 from 0.5 h to 8.5 h; host 1 fails at 1 h (the job shrinks to 3 replicas,
    GPUs 0-23, for the rest of the run); host 0's NIC 0 is down from 2 h to 6 h. The shrunk states with the
    throttle are those without it: no GPU slowed, with the NIC down and without. Before, GPU 30 was listed and
    dropped from the step while the NIC was down (10.088 ms, as without it), and stood in on GPU 0 without it,
    slowing the job (8.577 ms against 7.755 ms)."""
    summary = job_with(ELASTIC_NIC, (0.5 * H, 2, 30, 8 * H), (1 * H, 0, 8, 10 * H), (2 * H, 1, 0, 4 * H)).summary
    shrunk = [state for state in summary["states"] if state["replicas"] == 3]
    assert [(bool(state["links_down"]), state["slow_gpus"]) for state in shrunk] == [(False, {}), (True, {})]
