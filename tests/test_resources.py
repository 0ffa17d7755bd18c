"""GPU time, energy and cost (`costs:`, summary.json's and job_summary.json's `resources`): each figure against
the hand arithmetic from the run's own step time, tokens and ETTR, the catalog's board powers against their
datasheets, and bad `costs` input refused at its line."""

from __future__ import annotations

import json

import pytest
from shared import SPARE_JOB, TRAINING_SCENARIO

from simulator import simulate
from simulator.catalog.gpus import GPUS
from simulator.cli import main
from simulator.config.loader import scenario_from_data, scenario_from_text
from simulator.reliability.simulate import simulate_job

EIGHT_B = """cluster: {topology: dgx-h100}
model: {preset: llama3-8b, layers: 2}
training: {seq_len: 2048, microbatches: 2}
parallelism: {dp: 8}
"""
"""8 H100s, a replica each, 2 micro-batches of 2,048 tokens: 8 x 2 x 2,048 = 32,768 tokens a step."""


def test_board_powers_are_the_datasheets():
    """A100 SXM 400 W, H100 / H200 SXM 700 W, B200 (HGX) 1,000 W, GB200 1,200 W: NVIDIA's datasheets and G.
    Lockwood's per-variant Blackwell table (simulator/catalog/gpus.py)."""
    assert {name: spec.board_power_w for name, spec in GPUS.items()} == {
        "a100-40gb": 400.0, "a100-80gb": 400.0, "h100-sxm": 700.0, "h200": 700.0, "b200": 1000.0, "gb200": 1200.0}


def test_a_step_without_costs_has_gpu_time_and_energy_at_board_power():
    summary = simulate(scenario_from_text(EIGHT_B)).summary
    resources, step = summary["resources"], summary["step_time_s"]
    assert summary["tokens_per_s"] * step == pytest.approx(32_768, rel=1e-12)
    assert resources["gpu_hours_per_step"] == pytest.approx(8 * step / 3600, rel=1e-12)
    # 8 GPUs x 700 W x step seconds, in kWh (3.6e6 J)
    assert resources["gpu_energy_kwh_per_step"] == pytest.approx(8 * 700 * step / 3.6e6, rel=1e-12)
    assert resources["gpu_hours_per_million_tokens"] == pytest.approx(8 * step / 3600 * 1e6 / 32_768, rel=1e-12)
    assert (resources["gpu_power_w"], resources["gpu_power_source"]) == (700.0, "board power")
    assert not any(key.startswith("cost") for key in resources)  # no price, no money


def test_a_price_and_a_power_of_ones_own():
    summary = simulate(scenario_from_text(EIGHT_B + "costs: {gpu_hour_price: 2.5, currency: EUR, "
                                          "gpu_power: 0.6 kW}\n")).summary
    resources, step = summary["resources"], summary["step_time_s"]
    assert resources["cost_per_step"] == pytest.approx(8 * step / 3600 * 2.5, rel=1e-12)
    assert resources["cost_per_million_tokens"] == pytest.approx(8 * step / 3600 * 2.5 * 1e6 / 32_768, rel=1e-12)
    assert resources["gpu_energy_kwh_per_step"] == pytest.approx(8 * 600 * step / 3.6e6, rel=1e-12)
    assert (resources["currency"], resources["gpu_power_source"]) == ("EUR", "costs.gpu_power")


def test_a_step_without_tokens_has_no_per_token_figures():
    """A synthetic model states no tokens: per-million figures are null, per-step ones stand (8 GPUs: the pipeline of
    2 stages x 4 replicas on one DGX)."""
    scenario = {**TRAINING_SCENARIO, "costs": {"gpu_hour_price": 1}}
    summary = simulate(scenario_from_data(scenario, {}, "<synthetic>", None)).summary
    resources = summary["resources"]
    assert resources["gpu_hours_per_step"] == pytest.approx(8 * summary["step_time_s"] / 3600, rel=1e-12)
    assert resources["cost_per_million_tokens"] is None
    assert resources["gpu_hours_per_million_tokens"] is None


def test_the_console_prints_the_line(tmp_path, capsys):
    scenario = tmp_path / "eight.yaml"
    scenario.write_text(EIGHT_B + "costs: {gpu_hour_price: 2}\n")
    assert main(["run", str(scenario), "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    resources = summary["resources"]
    line = next(line for line in capsys.readouterr().out.splitlines() if "per 1M tokens" in line)
    assert line.split("per 1M tokens")[1].strip() == (
        f"{resources['gpu_hours_per_million_tokens']:.4g} GPU-h, {resources['gpu_energy_kwh_per_million_tokens']:.4g}"
        f" kWh (700 W a GPU, board power), {resources['cost_per_million_tokens']:.4g} USD")


@pytest.mark.parametrize(("line", "field", "problem"), [
    ("  gpu_power: 700", "costs.gpu_power", "power 700 has no unit (allowed: W or kW, e.g. '700 W')"),
    ("  gpu_power: 700 kW", "costs.gpu_power", "700,000 W is no GPU's power"),
    ("  gpu_power: 0.7 W", "costs.gpu_power", "0.7 W is no GPU's power (allowed: 1 W to 5,000 W, e.g. '700 W')"),
    ("  gpu_hour_price: 0", "costs.gpu_hour_price", "0 is not above 0"),
    ("  currency: US dollars", "costs.currency", "currency 'US dollars' is not a short label"),
    ("  price: 3", "costs.price", "unknown key 'price' (allowed: gpu_hour_price, currency, gpu_power)"),
])
def test_bad_costs_are_refused_at_their_line(tmp_path, capsys, line, field, problem):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(EIGHT_B + "costs:\n" + line + "\n")
    assert main(["run", str(scenario), "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: {scenario}:6: {field}: ") and problem in error and "\n" not in error
    assert not (tmp_path / "run").exists()


def test_a_scenario_without_costs_keeps_its_digest_fields():
    """The section is left out of the validated scenario's dump where it is the default, so the digests of
    scenarios written before it (a sweep's journal, a job's state cache) stand."""
    assert "costs" not in scenario_from_text(EIGHT_B).scenario.model_dump(mode="json")
    assert "costs" in scenario_from_text(EIGHT_B + "costs: {currency: EUR}\n").scenario.model_dump(mode="json")


def test_a_job_pays_for_every_gpu_it_holds_over_the_horizon():
    """SPARE_JOB: 2 DGX hosts (16 GPUs) and 1 spare host (8) held for 2 d = 48 h: 24 x 48 = 1,152 GPU-h, at 3 USD
    3,456 USD; lost: all but the training GPUs' productive hours, 1,152 - 16 x 48 x ETTR (the spare's 384 among
    them); per million tokens: over the goodput's tokens in the horizon."""
    job = simulate_job(scenario_from_text(SPARE_JOB + "costs: {gpu_hour_price: 3}\n")).summary
    resources = job["resources"]
    assert (resources["gpus_held"], resources["spare_gpus"]) == (24, 8)
    assert resources["gpu_hours"] == 1152.0 and resources["cost"] == 3456.0
    assert resources["gpu_hours_lost"] == pytest.approx(1152.0 - 16 * 48 * job["ettr"]["mean"], rel=1e-12)
    assert resources["gpu_hours_lost"] > 384.0  # the spare host's 8 GPUs, held 48 h, never train
    trained = job["goodput_tokens_per_s"]["mean"] * 172_800
    assert resources["gpu_hours_per_million_tokens"] == pytest.approx(1152.0 * 1e6 / trained, rel=1e-12)
    assert resources["cost_per_million_tokens"] == pytest.approx(3456.0 * 1e6 / trained, rel=1e-12)
    assert "gpu_energy_kwh" not in resources  # idle and spare GPUs' draw is unknown


def test_a_study_gives_what_a_million_tokens_cost_at_each_interval(tmp_path):
    """study.csv: 24 GPUs held (SPARE_JOB) over the horizon, over each point's mean goodput: GPU-h per million
    tokens = 24 x 10^6 / (3,600 x goodput), at 3 USD a GPU-hour 3 times that; the horizon cancels."""
    import pandas as pd

    scenario = tmp_path / "job.yaml"
    scenario.write_text(SPARE_JOB + "costs: {gpu_hour_price: 3}\n")
    out = tmp_path / "study"
    assert main(["study", "checkpoint-interval", str(scenario), "--intervals", "10min,1h", "--out", str(out),
                 "--quiet"]) == 0
    rows = pd.read_csv(out / "study.csv")
    hours = 24 * 1e6 / (3600 * rows["goodput_tokens_per_s"])
    # six significant digits in the CSV, in both columns compared
    assert list(rows["gpu_hours_per_million_tokens"]) == pytest.approx(list(hours), rel=1e-5)
    assert list(rows["cost_per_million_tokens"]) == pytest.approx(list(3 * hours), rel=1e-5)
    assert rows["cost_per_million_tokens"].iloc[0] != rows["cost_per_million_tokens"].iloc[1]


def test_a_jobs_step_summary_is_priced_as_the_step_alone_and_a_price_shares_its_steps(tmp_path):
    """The job folder's summary.json is the healthy step's as `trainsim run` of the step alone writes it, its
    `resources` included (the states simulate steps without them); `costs` changes no step, so two jobs that differ
    in price alone share one step key (a study or sweep over the price re-simulates nothing)."""
    from simulator.reliability.states import step_key

    priced = scenario_from_text(SPARE_JOB + "costs: {gpu_hour_price: 3}\n")
    job = simulate_job(priced)
    resources = job.step_summary["resources"]
    step = job.step_summary["step_time_s"]
    assert resources["gpu_hours_per_step"] == pytest.approx(16 * step / 3600, rel=1e-12)
    assert resources["cost_per_step"] == pytest.approx(3 * 16 * step / 3600, rel=1e-12)
    assert step_key(priced) == step_key(scenario_from_text(SPARE_JOB))


def test_the_job_table_gives_its_gpu_time_as_docs_outputs_md_does():
    """docs/outputs.md's 70B job over 2 d at 2 USD: 2,112 x 48 h = 101,376 GPU-h held, 64 of them spares; less
    2,048 x 48 h x ETTR 0.9825164 = 96,585.3 training, 4,790.7 kept no progress (4.7%); 202,752 USD."""
    from simulator.console.report import job_resources_text

    resources = {"gpu_hour_price": 2.0, "currency": "USD", "gpus_held": 2112, "spare_gpus": 64, "gpu_hours": 101376.0,
                 "cost": 202752.0, "gpu_hours_per_million_tokens": 0.4623, "cost_per_million_tokens": 0.9246,
                 "gpu_hours_lost": 101376.0 - 2048 * 48 * 0.9825164}
    assert job_resources_text(resources) == (
        "101,376 GPU-h (2,112 GPUs held, 64 of them spares), 4,791 lost (4.7%); 0.4623 GPU-h per 1M tokens trained; "
        "202,752 USD (0.9246 USD per 1M tokens)")
    unpriced = {key: value for key, value in resources.items() if not key.startswith(("cost", "gpu_hour_price"))}
    assert job_resources_text({**unpriced, "spare_gpus": 0, "gpus_held": 2048}).startswith(
        "101,376 GPU-h (2,048 GPUs held), ")


def test_the_step_row_per_step_without_tokens_and_at_ones_own_power():
    """Without tokens the row is per step (docs/console.md's 1F1B: 8 GPUs x 33 ms / 3,600 = 7.333e-05 GPU-h, at
    700 W 5.133e-05 kWh); at `costs.gpu_power` it does not say board power."""
    from simulator.console.report import resources_row

    hours = 8 * 0.033 / 3600
    resources = {"gpu_power_w": 700.0, "gpu_power_source": "board power", "gpu_hours_per_step": hours,
                 "gpu_energy_kwh_per_step": hours * 0.7, "gpu_hours_per_million_tokens": None,
                 "gpu_energy_kwh_per_million_tokens": None}
    assert resources_row(resources) == ("per step", "7.333e-05 GPU-h, 5.133e-05 kWh (700 W a GPU, board power)")
    own = {**resources, "gpu_power_w": 600.0, "gpu_power_source": "costs.gpu_power",
           "gpu_energy_kwh_per_step": hours * 0.6}
    assert resources_row(own) == ("per step", "7.333e-05 GPU-h, 4.4e-05 kWh (600 W a GPU)")
