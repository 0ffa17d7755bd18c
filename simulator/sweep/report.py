"""What `trainsim search` prints and writes: the ranked simulated layouts, the decision tree's path and the
comparison; OUT/candidates.parquet and .csv (every layout with its status and reason) and OUT/search.json."""

from __future__ import annotations

import json
import math
import shlex
import textwrap
from pathlib import Path

import orjson
import pandas as pd

from simulator.metrics.summary import without_reason
from simulator.report.run_folder import SEARCH_FOLDER, trainsim_version, write_run_folder
from simulator.report.tables import csv_text
from simulator.sweep.layouts import Pruned
from simulator.sweep.results import CandidateStatus, ranked, simulations_done
from simulator.sweep.search import SearchResult
from simulator.units import counted, format_memory
from simulator.workload import memory_plan
from simulator.workload.memory_plan import GIB

SHOWN = 10
TIGHT_MARK = "!"
"""The mark after the peak of a layout that fits with less room than the memory plan leaves out."""
WIDTH = 118
"""The width the comparison's sentences are wrapped to (one line of 600 characters ran off every terminal)."""


_TREE_MARKS = {True: " (tree)", False: " (tree, outside the space)"}
"""How the decision tree's layout is marked in the ranking, by whether it is a layout of the searched space."""


def format_search(result: SearchResult, scenario: str) -> str:
    """The best simulated layouts as a table (the searched space's ranked, then the tree's layout where it lies
    outside the space, after them), the status counts with the pruned ones
    by kind, the tree's steps one a line, the comparison,
    wrapped, and the command that runs the winner of the search of ``scenario`` (its outputs, as any run's)."""
    table = result.table
    simulated = table[table["status"] == CandidateStatus.SIMULATED]
    searched = simulated["searched"].astype(bool)
    rows = pd.concat([ranked(simulated[searched]), ranked(simulated[~searched])]).head(SHOWN).to_dict("records")
    layouts = [row["label"] + (_TREE_MARKS[bool(row["searched"])] if row["tree_choice"] else "") for row in rows]
    width = max([48, *map(len, layouts)])
    lines = [f"{'rank':>4}  {'layout':<{width}} {'tokens/s':>11} {'est tokens/s':>12} {'sim/est':>7} {'MFU':>6} "
             f"{'peak GiB':>8}  verdict"] if rows else []
    ranks = iter(range(1, len(rows) + 1))  # the tree's layout outside the searched space is shown, not ranked
    for row, layout in zip(rows, layouts):
        rank = next(ranks) if row["searched"] else "-"
        tight = TIGHT_MARK if row["memory_tight"] else " "
        lines.append(f"{rank:>4}  {layout:<{width}} {row['tokens_per_s']:>11,.0f} {_estimate_cells(row)} "
                     f"{100 * row['mfu']:>5.1f}% {row['peak_memory_gib']:>8.1f}{tight} "
                     f"{without_reason(row['bottleneck.verdict'], _exposed_share(row))}")
    if any(row["memory_tight"] for row in rows):
        roomy = (~simulated[searched]["memory_tight"].astype(bool)).any()
        room = f"{memory_plan.UNMODELLED_BYTES / GIB:.0f} GiB"
        lines.append(f"{TIGHT_MARK} under {room} left, less than the memory plan leaves out (at least {room}: the "
                     "CUDA context, NCCL's buffers, the allocator's fragmentation): a real GPU may run out of "
                     "memory; " + ("ranked after the layouts with that room" if roomy else
                                              "no simulated layout of the space has that room"))
    space, outside = split_by_space(table)
    lines.append(status_counts(space, outside))
    lines.extend(f"  pruned, {kind.label}: {counted(count, 'layout')}" for kind, count in pruned_by_kind(space).items())
    if not searched.any() and "memory_model_peak_gib" in space and space["memory_model_peak_gib"].notna().any():
        leanest = space.sort_values(["memory_model_peak_gib", "label"]).iloc[0]  # no figure (NaN) sorts last
        least = format_memory(leanest["memory_model_peak_gib"])
        lines.append(f"least memory of any layout: {leanest['label']}, {least} per GPU by the memory model")
    first, *rest = result.tree.steps
    lines.append(f"decision tree (rules of thumb, docs/studies.md): {first}")
    lines.extend(line for step in rest for line in textwrap.wrap(step, WIDTH, initial_indent="  -> ",
                                                                 subsequent_indent="     ", break_long_words=False))
    if result.ddp_turned_off:
        lines.append(ddp_turned_off_text(result.ddp_turned_off))
    lines.extend(textwrap.wrap(result.comparison, WIDTH, break_long_words=False, break_on_hyphens=False))
    if result.winner is not None and result.winner.get("overrides"):
        sets = [word for item in json.loads(result.winner["overrides"]) for word in ("--set", item)]
        lines.append(f"run the best: {shlex.join(['trainsim', 'run', scenario, *sets, '--out', 'DIR'])}")
    return "\n".join(lines)


def _exposed_share(row: dict) -> float | None:
    """The exposed-communication share a row's verdict reads (`bottleneck.verdict_exposed_share`), None where
    its table has none."""
    share = row.get("bottleneck.verdict_exposed_share")
    return None if share is None or pd.isna(share) else float(share)


def _estimate_cells(row: dict) -> str:
    """A ranked row's estimated tokens/s (the search's model, before simulating) and the simulation's over it,
    to four decimals, so that the estimate's accuracy (docs/search-accuracy.md) reads off the table; '-' in both
    where the row has no estimate."""
    estimate = row.get("estimate_tokens_per_s")
    if not estimate or math.isnan(estimate):
        return f"{'-':>12} {'-':>7}"
    return f"{estimate:>12,.0f} {row['tokens_per_s'] / estimate:>7.4f}"


def write_search(out_dir: Path, result: SearchResult, scenario: str, overrides: list[str]) -> list[str]:
    """candidates.parquet, candidates.csv and search.json, written as one run folder with a manifest
    (report/run_folder.py): moved in together once all three exist, so a search refused or interrupted while
    writing leaves the folder as it was, never a table of one search beside the summary of another. Returns
    the names written, manifest last."""
    statuses = result.table["status"]
    simulated, of = simulations_done(statuses)
    space, outside = split_by_space(result.table)
    summary = {
        "stopped": bool((statuses == CandidateStatus.STOPPED).any()),
        "simulated": simulated,
        "of": of,
        "winner": _clean(result.winner),
        "tree_choice": _clean(result.tree_row),
        "tree_steps": list(result.tree.steps),
        "comparison": result.comparison,
        "layouts": len(space),
        "status_counts": space["status"].value_counts().sort_index().to_dict(),
        "pruned_by_kind": {kind.value: count for kind, count in pruned_by_kind(space).items()},
        "tree_outside_space": next(({"label": row["label"], "status": row["status"]}
                                    for row in outside.to_dict("records")), None),
        "ddp_turned_off": result.ddp_turned_off,
    }

    def write(stage: Path) -> None:
        result.table.to_parquet(stage / "candidates.parquet", index=False)
        (stage / "candidates.csv").write_bytes(csv_text(result.table).encode())
        (stage / "search.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))

    identity = {"scenario": scenario, "overrides": list(overrides), "trainsim_version": trainsim_version()}
    return write_run_folder(out_dir, identity, write, SEARCH_FOLDER)


def split_by_space(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of a search's ``table`` that are layouts of the searched space, and those outside it (the decision
    tree's layout, simulated for the comparison where the space leaves it out): what the counts of the text and
    of search.json count, and what they tell apart."""
    in_space = table["searched"].astype(bool)
    return table[in_space], table[~in_space]


def status_counts(space: pd.DataFrame, outside: pd.DataFrame) -> str:
    """The searched ``space``'s layouts by status in one line (simulated, pruned and failed always, stopped where
    a stopped search left any), and the decision tree's layout apart where it lies ``outside`` the space
    (simulated for the comparison, never one of the space's): the search's text, and the front chart's title."""
    counts = space["status"].value_counts().to_dict()
    shown = [CandidateStatus.SIMULATED, CandidateStatus.PRUNED, CandidateStatus.FAILED,
             *([CandidateStatus.STOPPED] if counts.get(CandidateStatus.STOPPED) else [])]
    line = f"{counted(len(space), 'layout')}: " + ", ".join(f"{counts.get(status, 0):,} {status}" for status in shown)
    return line + "".join(f" (+ the tree's {row['label']}, outside the space: {row['status']})"
                          for row in outside.to_dict("records"))


def ddp_turned_off_text(turned_off: dict[str, list[str]]) -> str:
    """The scenario's ddp options the layouts of some shardings turned off, in one line."""
    named = "; ".join(f"{name} ({', '.join(shardings)} layouts)" for name, shardings in turned_off.items())
    return f"the scenario's ddp options turned off where the layout's sharding cannot take them: {named}"


def pruned_by_kind(table) -> dict[Pruned, int]:
    """How many layouts were pruned for each kind of reason, most first (then in `Pruned`'s order)."""
    counts = table["reason_kind"].value_counts().to_dict()
    kinds = sorted((kind for kind in Pruned if counts.get(kind.value)), key=lambda kind: -counts[kind.value])
    return {kind: int(counts[kind.value]) for kind in kinds}


def _clean(row: dict | None) -> dict | None:
    """A table row as JSON-ready values (NaN as null, numpy scalars as Python numbers, `overrides` a list)."""
    if row is None:
        return None
    clean = {}
    for key, value in row.items():
        value = value.item() if hasattr(value, "item") else value
        if key == "overrides" and isinstance(value, str):  # the table's JSON text, a list in search.json
            value = json.loads(value)
        clean[key] = None if isinstance(value, float) and math.isnan(value) else value
    return clean
