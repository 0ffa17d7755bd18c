"""Scenarios shipped with trainsim, runnable by name from any folder (`trainsim run llama3-8b-dgx-h100-dp8`)
and listed by `trainsim scenarios`.

In a source checkout or an editable install they are the repository's scenarios/ folder; a wheel installs them
under <prefix>/share/trainsim/scenarios (pyproject's data-files), as it does the topologies.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

import simulator
from simulator.errors import ScenarioError

SOURCE_TREE_DIR = Path(simulator.__file__).resolve().parents[1] / "scenarios"
INSTALLED_DIR = Path(sys.prefix) / "share" / "trainsim" / "scenarios"
BUNDLED_DIR = SOURCE_TREE_DIR if SOURCE_TREE_DIR.is_dir() else INSTALLED_DIR


def bundled_scenarios() -> list[str]:
    """Names of the bundled scenarios, sorted."""
    return sorted(path.stem for path in BUNDLED_DIR.glob("*.yaml"))


def scenario_description(name: str) -> str:
    """The first sentence of a bundled scenario's `description:`, on one line and without its full stop, as the
    one-line descriptions are written (the list ended four of its 23 lines with '.', the others without)."""
    try:
        data = yaml.safe_load((BUNDLED_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ""
    description = data.get("description", "") if isinstance(data, dict) else ""
    if not isinstance(description, str):
        return ""
    text = " ".join(description.split())
    end = text.find(". ")
    return (text if end < 0 else text[:end]).removesuffix(".")


def resolve_scenario(name_or_path: str | Path) -> Path:
    """The file a scenario argument names: an existing file, else a bundled scenario by name ('.yaml' may be
    left out); anything else is an error listing the bundled names. A folder of the scenario's name (where
    `trainsim run NAME --out NAME` put its outputs) does not hide the scenario; a folder of no scenario's name
    is returned, for the reader to say what it is."""
    path = Path(name_or_path)
    if path.is_file() or path.parent != Path("."):
        return path
    bundled = bundled_file(path.name)
    if bundled is not None:
        return bundled
    if path.exists():
        return path
    name = path.stem if path.suffix in (".yaml", ".yml") else path.name
    raise ScenarioError(f"no such file, and no bundled scenario named {name!r}", file=str(name_or_path),
                        allowed=", ".join(bundled_scenarios()) + ", or a path to a YAML file")


def bundled_file(name: str) -> Path | None:
    """The bundled scenario called ``name`` ('.yaml' may be left out), or None when there is none."""
    if Path(name).parent != Path("."):
        return None
    bundled = BUNDLED_DIR / (name if Path(name).suffix in (".yaml", ".yml") else f"{name}.yaml")
    return bundled if bundled.is_file() else None
