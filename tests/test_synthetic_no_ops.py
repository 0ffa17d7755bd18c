"""A field a synthetic model cannot be changed by (SYNTHETIC_NO_OPS) is warned of: by `run` once per field the
scenario gives, by `sweep` once per axis over it; docs/studies.md's sweep example varies none on a synthetic base
(its bucket, overlap and ZeRO axes did, on schedule-gpipe-p4-m8: half its points repeated the other half)."""

from __future__ import annotations

import json
import re

from shared import REPO

from simulator.cli import main
from simulator.sweep.spec import sweep_from_text

NO_GRADIENTS = "a synthetic model has no gradients to reduce"


def test_run_warns_once_of_a_set_field_a_synthetic_model_ignores_and_not_for_a_model(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "schedule-gpipe-p4-m8", "--set", "parallelism.ddp.overlap=false", "--out", str(out),
                 "--quiet"]) == 0
    warning = f"--set parallelism.ddp.overlap=false: {NO_GRADIENTS}: it changes nothing"
    assert capsys.readouterr().err.splitlines() == [f"warning: command line: trainsim run: {warning}"]
    assert json.loads((out / "summary.json").read_text())["warnings"] == [warning]
    assert main(["validate", "llama3-8b-dgx-h100-dp8", "--set", "parallelism.ddp.overlap=false", "--quiet"]) == 0
    assert NO_GRADIENTS not in capsys.readouterr().err


SWEEP = """base: {base}
zip:
  parallelism.ddp.bucket: [1 MiB, 25 MiB]
  parallelism.ddp.overlap: [false, true]
grid:
  parallelism.pipeline.schedule: [gpipe, 1f1b]
"""


def test_a_sweep_warns_once_per_axis_a_synthetic_model_ignores():
    sweep = sweep_from_text(SWEEP.format(base="schedule-gpipe-p4-m8"), "sw.yaml")
    assert sweep.warnings == tuple(
        f"sw.yaml:{line}: zip.parallelism.ddp.{field}: {NO_GRADIENTS}: every point's model is synthetic, so no "
        "point changes with this axis" for line, field in ((3, "bucket"), (4, "overlap")))
    assert sweep_from_text(SWEEP.format(base="llama3-8b-dgx-h100-dp8"), "sw.yaml").warnings == ()


def test_the_sweep_example_of_studies_md_varies_what_its_base_reads():
    text = (REPO / "docs" / "studies.md").read_text()
    example = next(block for block in re.findall(r"```yaml\n(.*?)```", text, re.S) if "\ngrid:" in block)
    sweep = sweep_from_text(example, "docs/studies.md", REPO / "docs")
    assert sweep.warnings == ()
    assert all(point.data["model"] == {"preset": "llama3-8b"} for point in sweep.points)
