"""End to end against Megatron-LM SC21 Table 1 (tests/data/megatron_sc21_table1.csv): predicted TFLOP/s per GPU,
counted with the paper's formula (full recompute), within 15% of the published figure for the rows up to 512
GPUs. The A100 calibration was fitted on the 1.7B and 18.4B rows only (simulator/catalog/calibration.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from simulator.catalog.models import get_model
from simulator.workload.transformer import megatron_flops_per_iteration

TABLE = Path(__file__).parent / "data" / "megatron_sc21_table1.csv"
PRESETS = {1.7: "megatron-1.7b", 3.6: "megatron-3.6b", 7.5: "megatron-7.5b", 18.4: "megatron-18.4b",
           39.1: "megatron-39.1b", 76.1: "megatron-76.1b", 145.6: "megatron-145.6b", 310.1: "megatron-310.1b",
           529.6: "megatron-529.6b", 1008.0: "megatron-1t"}


def rows(max_gpus: int) -> list[dict]:
    lines = [line for line in TABLE.read_text().splitlines() if not line.startswith("#")]
    return [row for row in csv.DictReader(lines) if int(row["gpus"]) <= max_gpus]


def scenario(row: dict) -> str:
    model = get_model(PRESETS[float(row["params_b"])])
    pp = int(row["pp"])
    per_chunk = row["layers_per_virtual_stage"]
    v = model.layers // pp // int(per_chunk) if per_chunk else 1
    schedule = "interleaved" if v > 1 else "1f1b"
    return f"""
cluster: {{topology: dgx-a100-cluster, nodes: {int(row['gpus']) // 8}}}
model: {{preset: {model.name}}}
training: {{seq_len: 2048, global_batch: {row['global_batch']}, micro_batch: {row['micro_batch']},
           precision: fp16, recompute: full, attention: standard}}
parallelism: {{tp: {row['tp']}, pp: {pp}, pipeline: {{schedule: {schedule}, virtual_stages: {v}}}}}
"""


def predicted_tflops(run_yaml, row: dict) -> float:
    summary = run_yaml(scenario(row)).summary
    model = get_model(PRESETS[float(row["params_b"])])
    flops = megatron_flops_per_iteration(model, int(row["global_batch"]), 2048, recompute=True)
    return flops / (summary["step_time_s"] * int(row["gpus"])) / 1e12


@pytest.mark.parametrize("row", rows(512), ids=lambda row: f"{row['params_b']}B")
def test_megatron_sc21_throughput_within_15_percent(run_yaml, row):
    assert predicted_tflops(run_yaml, row) == pytest.approx(float(row["tflops_per_gpu"]), rel=0.15)
