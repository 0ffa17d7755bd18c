"""A job's figures against the closed forms of exponential failures, each within the Monte Carlo error of the
replications run.

One DGX H100 (8 GPUs, TP 8) trains for 30 days; every GPU fails as a Poisson process with a 24 h MTBF and each
failure restarts the job (M = 24 h / 8 = 3 h of system MTBF). A 60 GB checkpoint goes to storage at 1 GB/s
(sync: C = 60 s of stall; async: a 0.15 s snapshot, then W = 60 s of background write), restart R = 1 min
detection + 2 min rescheduling + 3 min launch + 60 s load + 10 warm-up steps.

Every tolerance is about 3 standard errors of the simulated mean (1.53 of its 95% half-widths, 3 sigma of the
Poisson band), so a change of random streams under a correct model trips one only rarely (about 0.3% each)
where 1.96 sigma would trip one of these checks with about 20% chance; the alternative model each check
exists to reject stays outside it.

- System MTBF: M = per-GPU MTBF / GPUs exactly; mean interruptions within the Poisson band H / M +/- 3
  sqrt(H / M / n).
- Restart: a failure during a restart starts it over, so each interruption spends min(R, X) restarting, X
  exponential with mean M: E[min(R, X)] = M (1 - e^(-R/M)) = 414.9 s for R = 423.1 s, within 3 standard
  errors (from E[min(R, X)^2] = 2 M^2 (1 - e^(-R/M) (1 + R/M)) over the interruptions simulated).
- Sync ETTR (Daly's renewal: a failure restarts the restart, so a cycle of T + C work needs R + T + C
  without a failure): ETTR = T e^(-R/M) / (M (e^((T+C)/M) - 1)) within 1.53 of the simulated 95% half-widths.
- Async ETTR: the checkpoint is durable W after its snapshot, so a failure in that window rolls back one more
  interval; for W < T: ETTR = T e^(-(R+W)/M) / (M (e^((T+c)/M) - 1)), c the snapshot. Without the W term the
  formula is 0.0050 to 0.0053 higher (0.0043 to 0.0046 above the simulated mean, 2.6 to 4.3 of its 95%
  half-widths, at least 5.2 standard errors).
- Lost work per failure (sync, failures while training or writing): a failure x into a cycle (density
  proportional to e^(-x/M) on [0, T + C)) loses min(x, T):
  E = (M^2 (1 - e^(-T/M) (1 + T/M)) + T M (e^(-T/M) - e^(-(T+C)/M))) / (M (1 - e^(-(T+C)/M))) = 324.0 s for
  a 10 min interval (T / 2 = 300 s and the write's 60 s at T). T / 2 alone lies 7.0 half-widths below
  the simulated mean.
- Interruptions counted against the renewal count: four one-GPU hosts, each GPU failing (taking its host) with
  a 20 h MTBF, exponential or Weibull of shape 0.5, over 30 days: every unit's process is in equilibrium, so
  E[failures] = 4 x 720 h / 20 h = 144 whatever the shape. With no detection or rescheduling and spares always at
  hand, a spare stands in at once and each failure hits a host the job uses, also during a 2 h launch: the
  interruptions counted are the failures. Before a spare standing in counted as in use (its slot stayed out until
  the restart ended) 130.7 and 92.5 were counted, 6.3 and 10.1 half-widths below 144.
- The 95% interval narrows as 1 / sqrt(n): from 40 to 160 replications its half-width halves (t(39) / t(159)
  x std ratio; the std of 40 replications is itself known to about 11%, so within 25%).
"""

from __future__ import annotations

import math

import pytest
from shared import ONE_GPU_HOSTS, inside, renewal_ettr

from simulator.config.loader import scenario_from_text

JOB = """
cluster: {topology: dgx-h100, gpus: 8}
model: {preset: llama3-8b}
training: {seq_len: 2048, global_batch: 8}
parallelism: {tp: 8}
run: {horizon: 30 d, replications: 40, seed: 7}
faults:
  components:
    job_failure: {unit: gpu, effect: restart, mtbf: 24 h}
checkpoint: {interval: 10 min, size: 60 GB, mode: sync}
storage: {host_write: 1 GB/s, host_read: 1 GB/s, write: 1 GB/s, read: 1 GB/s}
restart: {detection: 1 min, reschedule: 2 min, launch: 3 min, warmup_steps: 10}
"""
M = 24 * 3600.0 / 8


def job(*settings: str) -> dict:
    from simulator.reliability.simulate import simulate_job

    return simulate_job(scenario_from_text(JOB, "closed-forms.yaml", list(settings))).summary


@pytest.fixture(scope="module")
def sync_job():
    return job()


def test_system_mtbf_is_the_gpus_mtbf_over_their_count(sync_job):
    horizon, n = sync_job["horizon_s"], sync_job["replications"]
    assert sync_job["mtbf_s"] == pytest.approx(M, rel=1e-12)
    expected = horizon / M  # 240 interruptions in 30 days
    band = 3 * math.sqrt(expected / n)
    assert abs(sync_job["interruptions"]["unexpected"]["mean"] - expected) <= band  # today 238.0 of 240 +/- 7.3


def test_each_interruption_restarts_for_the_mean_of_min_r_and_the_next_failure(sync_job):
    r = sync_job["restart"]["total_s"]
    assert r == pytest.approx(60 + 120 + 180 + 60e9 / 1e9 + 10 * sync_job["step_time_s"], rel=1e-12)
    interruptions = sync_job["interruptions"]["unexpected"]["mean"] * sync_job["replications"]
    per_interruption = sync_job["time_s"]["restart_s"]["mean"] * sync_job["replications"] / interruptions
    mean = M * (1 - math.exp(-r / M))
    variance = 2 * M**2 * (1 - math.exp(-r / M) * (1 + r / M)) - mean**2
    assert mean == pytest.approx(414.9, abs=0.05)
    assert abs(per_interruption - mean) <= 3 * math.sqrt(variance / interruptions)  # today 414.4 s, 1.0 of 0.49 s
    assert abs(r - mean) > 3 * math.sqrt(variance / interruptions)  # restarts no failure interrupts: 16.8


def test_sync_ettr_is_dalys_renewal(sync_job):
    """With R = 7 min against M = 3 h this job cannot tell Daly's model from one whose restarts never fail
    (0.8484, inside too); tests/test_reliability_study.py's large restart cost (R = 1 h) tells them apart."""
    checkpoint = sync_job["checkpoint"]
    assert checkpoint["cost_s"] == pytest.approx(60.0, rel=1e-12)
    exact = renewal_ettr(checkpoint["interval_s"], sync_job["restart"]["total_s"], cost=60.0, mtbf=M)
    assert inside(exact, sync_job["ettr"], 0.0015)  # today 0.8481 (95%: 0.8469 to 0.8493) against 0.8477


@pytest.mark.parametrize("interval", ["5 min", "20 min"])
def test_async_ettr_counts_the_write_before_a_checkpoint_is_durable(interval):
    summary = job("checkpoint.mode=async", f"checkpoint.interval={interval}")
    checkpoint, restart = summary["checkpoint"], summary["restart"]["total_s"]
    assert (checkpoint["stall_s"], checkpoint["write_s"], checkpoint["slowdown"]) == pytest.approx((0.15, 60.0, 0.0))
    exact = renewal_ettr(checkpoint["interval_s"], restart + checkpoint["write_s"], cost=checkpoint["cost_s"],
                         mtbf=M)
    assert inside(exact, summary["ettr"], 0.002)  # today within 0.0007 of it (half-widths 0.0011 and 0.0017)
    without_write = renewal_ettr(checkpoint["interval_s"], restart, cost=checkpoint["cost_s"], mtbf=M)
    assert not inside(without_write, summary["ettr"], 0.002)


def test_lost_work_per_failure_is_the_truncated_exponential_mean(sync_job):
    t = sync_job["checkpoint"]["interval_s"]
    s = t + 60.0
    exact = ((M**2 * (1 - math.exp(-t / M) * (1 + t / M)) + t * M * (math.exp(-t / M) - math.exp(-s / M)))
             / (M * (1 - math.exp(-s / M))))
    assert exact == pytest.approx(323.92, abs=0.01)
    assert inside(exact, sync_job["lost_work_per_failure_s"], 5.0)  # today 325.6 s (95%: 321.8 to 329.4)
    assert not inside(t / 2, sync_job["lost_work_per_failure_s"], 5.0)


def test_the_interval_narrows_as_one_over_the_root_of_the_replications(sync_job):
    wide = sync_job["ettr"]
    narrow = job("run.replications=160")["ettr"]
    half = [(interval["ci95_high"] - interval["ci95_low"]) / 2 for interval in (wide, narrow)]
    assert half[1] / half[0] == pytest.approx(0.5, rel=0.25)  # today 0.51
    assert narrow["ci95_low"] <= wide["mean"] <= narrow["ci95_high"]


RENEWAL_JOB = ONE_GPU_HOSTS + """run: {horizon: 30 d, replications: 100, seed: 0}
faults: {components: {gpu: {mtbf: 20 h, repair: 1 min, repair_distribution: fixed}}}
restart: {detection: 0 s, reschedule: 0 s, launch: 2 h, warmup_steps: 0, spares: 4}
"""


@pytest.mark.parametrize(("distribution", "widest"), [("exponential", 3.0), ("weibull", 6.0)])
def test_every_failure_of_a_host_in_use_interrupts_the_renewal_count_of_them(distribution, widest):
    """A failure during a restart's 2 h launch of any host the job uses interrupts, the spare standing in for a
    host taken out included: the interruptions counted are the failures, whose mean is the renewal count
    units x horizon / MTBF (144) with exponential failures and with Weibull ones of shape 0.5, which strike a
    replaced unit soon again."""
    from simulator.reliability.simulate import simulate_job

    settings = [f"faults.components.gpu.distribution={distribution}"]
    if distribution == "weibull":
        settings.append("faults.components.gpu.shape=0.5")
    summary = simulate_job(scenario_from_text(RENEWAL_JOB, "renewal.yaml", settings)).summary
    assert summary["failure_model"]["gpu"]["expected_in_horizon"] == pytest.approx(144.0, rel=1e-12)
    assert summary["restart_waiting_for_hosts_s"]["mean"] == 0.0  # the spares never ran out
    assert inside(144.0, summary["interruptions"]["unexpected"], widest)  # today 146.1 (2.3) and 141.9 (5.3)


WAITING_JOB = ONE_GPU_HOSTS.replace("interval: 1000 d", "interval: 10 min") + """
run: {horizon: 30 d, replications: 40, seed: 0}
faults: {components: {gpu: {mtbf: 20 h, repair: 1 d}}}
restart: {detection: 1 min, reschedule: 0 s, launch: 1 min, warmup_steps: 0}
"""


def test_the_mtbf_while_training_counts_no_repair_wait():
    """Four one-GPU hosts, GPU MTBF 20 h, 1 d repairs, no spare: the job waits for each repair, but while it
    trains all four GPUs are up, so it meets a failure every 20 h / 4 = 5 h of training, the M of Young's and
    Daly's intervals, whatever the repair (the horizon's 1 / (MTBF + repair) count says 44 h / 4 = 11 h). The
    failures outside restarts over the time outside restarts: 4.78 h, 625 failures, within 3 standard errors
    (M / sqrt(failures)) of 5 h."""
    from simulator.reliability.simulate import simulate_job

    result = simulate_job(scenario_from_text(WAITING_JOB, "waiting.yaml"))
    summary = result.summary
    assert summary["mtbf_s"] == pytest.approx(5 * 3600.0, rel=1e-12)
    assert summary["failure_model"]["gpu"]["expected_interruptions"] == pytest.approx(4 * 720 / 44, rel=1e-12)
    measured, failures = measured_training_mtbf(result)
    assert abs(measured - summary["mtbf_s"]) < 3 * summary["mtbf_s"] / math.sqrt(failures)


def shared_pool_mtbf_h(spares: int) -> float:
    """M of 4 one-GPU hosts whose NICs (MTBF 40 h, 12 h repairs, `degrade`, cutting their host off) and GPUs (MTBF
    40 h, 2 d repairs) draw on one pool of ``spares``: the job trains while the NICs down (each r / (M + r) =
    12 / 52 of the time) and the hosts in repair for GPUs (a Poisson count, mean 4 x 48 h / 40 h) are at most the
    pool; a NIC fails at 1 / 40 h while up, up M / (M + r) x P(3 others + GPUs <= spares) / P(4 + GPUs <= spares)
    of the time the job trains; a GPU at 1 / 40 h."""
    down, in_repair = 12 / 52, 4 * 48 / 40

    def trains(nics: int) -> float:
        return math.fsum(math.comb(nics, j) * down**j * (1 - down)**(nics - j)
                         * math.exp(-in_repair) * in_repair**i / math.factorial(i)
                         for j in range(nics + 1) for i in range(spares - j + 1))

    nic_up = (1 - down) * trains(3) / trains(4)
    return 1 / (4 * nic_up / 40 + 4 / 40)


def measured_training_mtbf(result) -> tuple[float, int]:
    """The time outside restarts over the failures outside restarts (those that start one), and their count."""
    training, failures = 0.0, 0
    for _, rows in result.events.groupby("replication"):
        restarts = rows[rows["kind"] == "restart"]
        starts, ends = restarts["start_s"].to_numpy(), restarts["end_s"].to_numpy()
        times = rows.loc[rows["kind"] == "failure", "start_s"].to_numpy()[:, None]
        failures += int((~((times > starts) & (times < ends)).any(axis=1)).sum())
        training += result.summary["horizon_s"] - (ends - starts).sum()
    return training / failures, failures


@pytest.mark.parametrize(("component", "spares", "hours"), [
    ("spine_switch: {mtbf: 10 h, repair: 12 h}", 0, 10 * 34 / 24),
    ("nic: {mtbf: 40 h, repair: 12 h, effect: degrade}", 4, 52 / 4),
    ("nic: {mtbf: 40 h, repair: 12 h, effect: degrade}", 1, 40 * 88 / (4 * 76)),
    ("leaf_switch: {mtbf: 10 h, repair: 12 h, effect: degrade}", 2, 10 * 34 / 44),
    ("leaf_switch: {mtbf: 10 h, repair: 12 h, effect: degrade}", 0, 10 / 2),
    ("nic: {mtbf: 40 h, repair: 12 h, effect: degrade}, gpu: {mtbf: 40 h, repair: 2 d}", 4, None),
], ids=["spines", "nics-4-spares", "nics-1-spare", "leaves-2-spares", "leaves-no-spare", "nics-and-gpus-4-spares"])
def test_the_mtbf_while_training_of_units_repaired_in_place(component, spares, hours):
    """Units that stay in repair where they are, four one-GPU hosts, M = 10 or 40 h, r = 12 h, 30 d, 40 replications:
    the failures outside restarts over the time outside restarts within 3 standard errors of M, M as derived by
    hand. Two spines interrupt as the last one up fails: 2 / (M + r) x r / (M + r) over the time they are not both
    down, 1 - (r / (M + r))^2: M (M + 2r) / 2r = 14.17 h (14.40 h simulated). A NIC stays in repair while a spare
    host stands in: 4 spares, 52 h / 4 = 13 h (13.30 h); 1 spare, the job training while at most one is down: M (M +
    4r) / 4 (M + 3r) = 11.58 h (11.83 h). A leaf cuts 2 hosts off, 2 spares cover one: (M + 2r) / 2 (M + r) x M =
    7.73 h (7.74 h); no spare, the job waits for each leaf: M / 2 = 5 h (5.15 h). NICs beside GPUs of 40 h whose
    hosts spend 2 d in repair, all drawing on one pool of 4 spares (`shared_pool_mtbf_h`): 5.386 h (5.39 h); a pool
    of 4 for the NICs alone said 1 / (4 / 40 h + 4 / 52 h) = 5.652 h."""
    from simulator.reliability.simulate import simulate_job

    text = ONE_GPU_HOSTS + f"""
run: {{horizon: 30 d, replications: 40, seed: 5}}
faults: {{components: {{{component}}}}}
restart: {{spares: {spares}}}
"""
    result = simulate_job(scenario_from_text(text, "in-place.yaml"))
    mtbf = result.summary["mtbf_s"]
    assert mtbf == pytest.approx((hours or shared_pool_mtbf_h(spares)) * 3600, rel=1e-12)
    measured, failures = measured_training_mtbf(result)
    assert abs(measured - mtbf) < 3 * mtbf / math.sqrt(failures)


SHARED_POOL_JOB = WAITING_JOB.replace("replications: 40", "replications: 400").replace("warmup_steps: 0}",
                                                                                       "warmup_steps: 0, spares: 1}")


def test_classes_that_take_hosts_draw_on_one_spare_pool():
    """A check of the simulation: GPUs and hosts (MTBF 100 h each, 12 h repairs) of four one-GPU hosts with one
    spare, where the pool runs dry and the restarts wait for repaired hosts. Both classes draw on the one spare,
    so the job is the one whose GPUs fail every 50 h: its waits and interruptions agree within the 95% intervals
    (400 replications: 160.0 h and 53.12 against 163.6 h and 52.90); a spare per class would leave far shorter
    waits. The closed form takes a spare at hand for each failure, 8 x 720 h / 100 h = 57.6, above both."""
    from simulator.reliability.simulate import simulate_job

    classes = "faults.components={gpu: {mtbf: 100 h, repair: 12 h}, host: {mtbf: 100 h, repair: 12 h}}"
    split = simulate_job(scenario_from_text(SHARED_POOL_JOB, "pool.yaml", [classes])).summary
    merged = simulate_job(scenario_from_text(SHARED_POOL_JOB, "pool.yaml", [
        "faults.components={gpu: {mtbf: 50 h, repair: 12 h}}"])).summary
    assert inside(split["restart_waiting_for_hosts_s"]["mean"], merged["restart_waiting_for_hosts_s"], 5 * 3600)
    assert inside(split["interruptions"]["unexpected"]["mean"], merged["interruptions"]["unexpected"], 1.0)
    for summary in (split, merged):
        assert summary["expected_unexpected_interruptions"] == pytest.approx(57.6, rel=1e-12)
        assert summary["interruptions"]["unexpected"]["ci95_high"] < 57.6


def test_with_no_spare_a_unit_is_out_while_any_failure_of_its_host_is_in_repair():
    """One DGX H100 host with no spare, GPUs of MTBF 200 h and the host of 25 h, 12 h repairs: the job waits for
    each repair, and no unit of the host fails meanwhile, whichever failed, so the host is up 1 / (1 + 8 x 12 /
    200 + 12 / 25) = 1 / 1.96 of the time and the job meets (8 / 200 h + 1 / 25 h) x 720 h / 1.96 = 29.39
    failures; 200 replications simulate 29.86 (95%: 29.35 to 30.38). Each unit's own repair alone said 8 x 720 /
    212 + 720 / 37 = 46.63. On four one-GPU hosts the count is an upper bound (the job waits for every host), and
    a class split in two is the same count: GPUs and hosts of 100 h as GPUs of 50 h, 4 x 720 / 62 = 46.45."""
    from simulator.reliability.simulate import simulate_job

    one_host = JOB.replace("size: 60 GB", "size: 1 GB")
    summary = simulate_job(scenario_from_text(one_host, "one-host.yaml", [
        "faults.components={gpu: {mtbf: 200 h, repair: 12 h}, host: {mtbf: 25 h, repair: 12 h}}",
        "run.replications=200"])).summary
    expected = (8 / 200 + 1 / 25) * 720 / 1.96
    assert summary["expected_unexpected_interruptions"] == pytest.approx(expected, rel=1e-12)
    assert inside(expected, summary["interruptions"]["unexpected"], 1.0)
    split, merged = (simulate_job(scenario_from_text(SHARED_POOL_JOB, "pool.yaml", [
        f"faults.components={components}", "restart.spares=0", "run.replications=1"])).summary
        for components in ("{gpu: {mtbf: 100 h, repair: 12 h}, host: {mtbf: 100 h, repair: 12 h}}",
                           "{gpu: {mtbf: 50 h, repair: 12 h}}"))
    assert split["expected_unexpected_interruptions"] == pytest.approx(4 * 720 / 62, rel=1e-12)
    assert merged["expected_unexpected_interruptions"] == pytest.approx(4 * 720 / 62, rel=1e-12)
