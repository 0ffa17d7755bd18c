"""The goodput chart of a job study: ETTR and goodput against the checkpoint interval, one line per
failure-rate multiplier, with Young's and Daly's intervals and the simulated optimum marked."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

from simulator.errors import InputError

STUDY_FILE = "study.json"


def load_study(folder: Path) -> dict:
    """study.json of a `trainsim study` folder."""
    path = folder / STUDY_FILE
    if not path.is_file():
        raise InputError(f"{folder} has no {STUDY_FILE}", field="DIR",
                         allowed="a folder written by `trainsim study ... --out DIR`")
    return json.loads(path.read_text())


def goodput_figure(study: dict) -> Figure:
    """Two panels sharing the interval axis (minutes, log scale): ETTR with its 95% band, and goodput."""
    figure = Figure(figsize=(8, 6.5), constrained_layout=True)
    ettr_axis, goodput_axis = figure.subplots(2, 1, sharex=True)
    for index, curve in enumerate(study["curves"]):
        color = f"C{index}"
        points = curve["points"]
        minutes = [p["interval_s"] / 60 for p in points]
        label = f"rate x {curve['rate_multiplier']:g} (MTBF {curve['mtbf_s'] / 3600:.3g} h)"
        ettr_axis.plot(minutes, [p["ettr"] for p in points], "o-", color=color, label=label)
        if all(p["ettr_ci95_low"] is not None for p in points):
            ettr_axis.fill_between(minutes, [p["ettr_ci95_low"] for p in points],
                                   [p["ettr_ci95_high"] for p in points], color=color, alpha=0.15)
        goodput_axis.plot(minutes, [p["goodput_tokens_per_s"] / 1e6 for p in points], "o-", color=color)
        for axis in (ettr_axis, goodput_axis):
            if curve["young_interval_s"]:
                axis.axvline(curve["young_interval_s"] / 60, color=color, linestyle="--", linewidth=0.9)
            if curve["daly_interval_s"]:
                axis.axvline(curve["daly_interval_s"] / 60, color=color, linestyle=":", linewidth=1.2)
        ettr_axis.plot([curve["best_interval_s"] / 60], [curve["best_ettr"]], "*", color=color, markersize=14)
    ettr_axis.plot([], [], "k--", linewidth=0.9, label="Young")
    ettr_axis.plot([], [], "k:", linewidth=1.2, label="Daly")
    ettr_axis.plot([], [], "k*", markersize=10, linestyle="none", label="simulated best")
    ettr_axis.set_xscale("log")
    ettr_axis.set_ylabel("ETTR (effective training time ratio)")
    ettr_axis.legend(fontsize=8)
    ettr_axis.grid(True, alpha=0.3)
    goodput_axis.set_ylabel("goodput (M tokens/s)")
    goodput_axis.set_xlabel("checkpoint interval (min)")
    goodput_axis.grid(True, alpha=0.3)
    figure.suptitle(Path(study["scenario"]).name)
    return figure
