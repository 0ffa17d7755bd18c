"""The tree stays ruff- and mypy-clean: CI runs both through the test command (settings in pyproject.toml); no test
module imports another."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from shared import REPO


def test_ruff_reports_nothing():
    command = [shutil.which("ruff") or "", "check", "--no-cache", "."]
    if not command[0]:
        command = [sys.executable, "-m", "ruff", "check", "--no-cache", "."]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_reports_nothing():
    """The package type-checks (settings in pyproject.toml's [tool.mypy]); no cache is read or written, so the
    check always sees the tree as it is (about 20 s of CPU)."""
    command = [sys.executable, "-m", "mypy", "--cache-dir", os.devnull, "simulator"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_test_module_imports_another():
    """What several test modules share lives in tests/shared.py: a test module imported by another ran its top
    level inside it and hid what was shared."""
    importing = [f"{path.name}:{number}" for path in sorted((REPO / "tests").glob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), start=1)
                 if re.match(r"\s*(from|import) (tests\.)?test_\w+", line)]
    assert importing == []
