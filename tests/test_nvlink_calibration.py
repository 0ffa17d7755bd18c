"""NVLink as NCCL uses it, per GPU: the catalog's NVLink and NVLS efficiencies against their published figures,
and the ring and NVLS all-reduce busbw the simulation gives on one NVSwitch domain against nccl-tests
(tests/data/catalog_sources.yaml; catalog/kernels.yaml sources nccl-nvlink and nccl-nvls)."""

from __future__ import annotations

import pytest
from shared import GIB

from simulator import simulate
from simulator.catalog.calibration import kernel_data, nvlink_efficiency, nvls_efficiency
from simulator.collective_sweep import collective_sweep
from simulator.config.loader import load_scenario
from simulator.errors import ScenarioError


def test_the_catalog_holds_the_published_nvlink_figures(catalog_sources):
    for gpu, measured in catalog_sources["ring_busbw_8_gpus"].items():
        assert nvlink_efficiency(gpu) == measured["busbw"] / measured["line_rate"]
    for gpu, efficiency in catalog_sources["nvls_efficiency"].items():
        assert nvls_efficiency(gpu) == efficiency
    assert nvls_efficiency("a100-80gb") is None
    data = kernel_data()
    for entry in data["gpus"].values():
        assert entry["nvlink"]["source"] in data["sources"]
        assert "nvls" not in entry or entry["nvls"]["source"] in data["sources"]


@pytest.mark.parametrize("topology, gpu", [("dgx-a100", "a100-80gb"), ("dgx-h100", "h100-sxm")])
def test_ring_all_reduce_on_8_gpus_reaches_the_measured_busbw(catalog_sources, topology, gpu):
    """The ring's busbw is the NVLink's measured fraction of line rate less the ring's latency (0.2% at 8 GiB);
    H100 ran at A100's fraction, 345 GB/s against the 370 measured (-6.9%)."""
    row = collective_sweep(topology, {}, op="all_reduce", algorithm="ring", ranks=8, sizes=[8 * GIB])[0]
    assert row["busbw_GBps"] == pytest.approx(catalog_sources["ring_busbw_8_gpus"][gpu]["busbw"], rel=0.005)


@pytest.mark.parametrize("ranks", [5, 6, 7, 8])
def test_nvls_all_reduce_on_h100_follows_the_measured_busbw(catalog_sources, ranks):
    """2 (p-1)/(p+1) x the ring's NVLink busbw x NCCL's nvlsEfficiency, out of the link loads: 419, 449, 471 and
    489 GB/s against the 420, 440, 460 and 480 measured (at most +2.4%); without the in-switch efficiency 8 GPUs
    gave 537 (+12%), 575 at H100's NVLink fraction."""
    row = collective_sweep("dgx-h100", {}, op="all_reduce", algorithm="nvls", ranks=ranks, sizes=[4 * GIB])[0]
    assert row["busbw_GBps"] == pytest.approx(catalog_sources["nvls_busbw_h100"][ranks], rel=0.025)


def test_nvls_on_gpus_without_nvlink_sharp_names_the_gpu(tmp_path):
    """A DGX H100 topology given A100s: the NVSwitches reduce but the GPUs cannot (NCCL has no NVLS before
    Hopper), one located line at `cluster.gpu_model`."""
    scenario = tmp_path / "a100-nvls.yaml"
    scenario.write_text("cluster: {topology: dgx-h100, gpu_model: a100-80gb}\n"
                        "workload:\n  - {name: a, op: all_reduce, bytes: 1 GiB, group: all, algorithm: nvls}\n")
    with pytest.raises(ScenarioError) as info:
        simulate(load_scenario(str(scenario)))
    assert info.value.field == "cluster.gpu_model"
    assert info.value.problem == "nvls needs GPUs with NVLink SHARP; a100-80gb has none"
    assert info.value.allowed == "h100-sxm, h200, b200, gb200"


def test_auto_on_gpus_without_nvlink_sharp_takes_the_ring():
    """`auto` must not pick what the GPUs cannot run: on a DGX H100 topology given A100s it weighed NVLS (the
    switches reduce) and the run ended in the nvls error although nvls was never asked for."""
    row = collective_sweep("dgx-h100", {"gpu_model": "a100-80gb"}, op="all_reduce", algorithm="auto", ranks=8,
                           sizes=[GIB])[0]
    assert row["resolved_algorithm"] == "ring"
