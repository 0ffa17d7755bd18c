"""`trainsim gpus`: the catalog as the simulation uses it, its efficiencies those the roofline takes."""

from __future__ import annotations

import re

import pytest

from simulator.catalog.gpus import GPUS
from simulator.cli import main
from simulator.workload.calibrated import calibrated_efficiency
from simulator.workload.roofline import matmul_plateau


def test_table_lists_every_gpu_with_its_peaks_memory_and_efficiencies(capsys):
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in GPUS}
    assert list(rows) == list(GPUS)
    # the H100's GEMM: MAMF's 80.3% at the boost clock times the sustained-clock ratio 0.848 (kernels.yaml)
    assert re.search(r"^h100-sxm +989 +1,979 +79\.6 GiB +3\.35 TB/s +450 GB/s +700 W +68\.1% +45\.4% / 38\.8% "
                     r"+88\.0%$", rows["h100-sxm"])
    assert re.search(r"^b200 +2,250 +4,500 +179\.1 GiB +7\.7 TB/s +900 GB/s +1,000 W ", rows["b200"])
    assert re.search(r"^a100-40gb +312 +- ", rows["a100-40gb"])
    assert "  h100-sxm: GEMM mamf-v2 x clock 0.848 (msmf-h200-transfer); attention fa3; HBM hbm" in out
    assert "  h200: GEMM trainsim-h200; attention trainsim-h200; HBM trainsim-h200" in out


@pytest.mark.parametrize("name, gemm", [("a100-40gb", 80.5), ("a100-80gb", 80.5), ("h100-sxm", 68.1),
                                        ("h200", 71.0), ("b200", 63.2), ("gb200", 63.2)])
def test_large_gemm_share_is_the_roofline_plateau(name, gemm, capsys):
    """Each GPU's large GEMM: its kernels.yaml share times its sustained-clock ratio, by hand (H100 0.803 x 0.848,
    H200 0.710 x 1, B200 0.776 x 0.815, A100 0.869 x 0.926), the plateau a 65,536-wide GEMM nears in the roofline."""
    assert main(["gpus", name]) == 0
    out = capsys.readouterr().out
    assert f"large GEMM: {gemm:.1f}%\n" in out
    assert matmul_plateau(calibrated_efficiency(name), 65536, ()) == pytest.approx(gemm / 100, abs=2e-3)
    assert "\nsources:\n  " in out


def test_one_gpu_cites_its_sources_in_full(capsys):
    assert main(["gpus", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert '  fa3: Shah et al., "FlashAttention-3" (2024)' in out
    assert "  msmf-h200-transfer: msmf's H200 ratio (698.6 / 823.9 = 0.848)" in out


def test_unknown_gpu_is_refused_in_one_line(capsys):
    assert main(["gpus", "b300"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown GPU 'b300'" in err and "h100-sxm" in err
