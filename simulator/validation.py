"""`trainsim validate-published`: run every scenario of scenarios/published/ and write docs/validation.md.

Each case is an ordinary scenario with a `published:` section (config/published.py) naming the measurement it
reproduces. The report is generated from the runs alone, so it cannot drift from the code; the checks that
compare against closed forms rather than published runs are listed with their tests (CHECKS).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.config.bundled import BUNDLED_DIR
from simulator.errors import ExecutorError, ScenarioError, WorkerKilled
from simulator.machine import usable_cores
from simulator.units import format_memory

if TYPE_CHECKING:
    from simulator.config.published import Metric

DEFAULT_FOLDER = BUNDLED_DIR / "published"
"""The bundled cases, found from any working folder (as `trainsim run NAME` finds a bundled scenario)."""
DEFAULT_REPORT = BUNDLED_DIR.parent / "docs" / "validation.md"
"""The report beside them: the source tree's docs/validation.md."""


@dataclass(frozen=True)
class CaseResult:
    """One published case run: the published and simulated figure, their relative error, and run facts."""

    case: str
    source: str
    metric: Metric
    published: float
    simulated: float
    tolerance: float
    fitted: str
    facts: tuple[tuple[str, str], ...]

    @property
    def error(self) -> float:
        """Relative error of the simulated figure against the published one."""
        return self.simulated / self.published - 1.0

    @property
    def within(self) -> bool:
        """Whether the relative error is within the case's tolerance."""
        return abs(self.error) <= self.tolerance


def result_line(result: CaseResult) -> str:
    """One case against its published figure, as validate-published prints it: a case past its tolerance says so
    (its line read like a passing one, the exit status alone telling them apart)."""
    line = (f"{result.case}: {UNITS[result.metric]}: published {result.published:g}, simulated "
            f"{result.simulated:.1f} ({result.error:+.1%}, tolerance {result.tolerance:.0%})")
    return line if result.within else f"{line}: OUTSIDE tolerance"


def outside_summary(results: Sequence[CaseResult]) -> str:
    """How many of the cases are outside their tolerance, and which (validate-published's last line and the
    report's)."""
    outside = [result.case for result in results if not result.within]
    cases = f"{len(results)} case{'s' if len(results) != 1 else ''}"
    if not outside:
        return f"all {cases} within their tolerance"
    return f"{len(outside)} of {cases} outside their tolerance: {', '.join(outside)}"


def published_cases(folder: Path = DEFAULT_FOLDER, names: Sequence[str] = ()) -> list[Path]:
    """The case files of ``folder``, sorted, or only those ``names`` (file names without .yaml); an empty or
    missing folder, or a name no case has, is an error (a mistyped --case ran nothing and passed)."""
    cases = sorted(folder.glob("*.yaml"))
    if not cases:
        raise ScenarioError(f"no scenarios in {folder}", field="--folder", allowed="a folder of published cases")
    unknown = [name for name in names if name not in {case.stem for case in cases}]
    if unknown:
        raise ScenarioError(f"no case {unknown[0]!r} in {folder}", field="--case",
                            allowed=", ".join(case.stem for case in cases))
    return [case for case in cases if not names or case.stem in names]


def _simulated(loaded, summary: dict, metric: Metric) -> float:
    from simulator.catalog.models import get_model
    from simulator.workload.transformer import megatron_flops_per_iteration

    if metric == "busbw_gbps":
        return float(summary["collectives"][0]["busbw_GBps"])
    if metric == "tflops_per_gpu":
        return float(summary["tflops_per_gpu"])
    training = loaded.scenario.training
    model = get_model(loaded.scenario.model.preset)
    flops = megatron_flops_per_iteration(model, training.global_batch, training.seq_len,
                                         recompute=training.recompute == "full")
    return flops / (summary["step_time_s"] * summary["gpus"]) / 1e12


def _facts(summary: dict) -> tuple[tuple[str, str], ...]:
    if "step_time_s" not in summary:
        return (("time", f"{summary['makespan_s'] * 1e3:.3f} ms"),)
    exposed = summary["exposed_comm_s"]
    return (
        ("step", f"{summary['step_time_s']:.2f} s"),
        ("bubble", f"{summary['bubble_fraction']:.1%}"),
        ("exposed TP / PP / DP", f"{exposed['tp']:.2f} / {exposed['pp']:.2f} / {exposed['dp']:.2f} s"),
        ("peak memory", f"{format_memory(summary['peak_memory_gib'])}{' (out of memory)' if summary['oom'] else ''}"),
        ("overlaps", ", ".join(name for name, on in summary.get("overlaps", {}).items() if on) or "none"),
        ("compute lost to SM contention", _contention(summary.get("sm_contention"))),
        ("simulated", _folding(summary)),
    )


def _folding(summary: dict) -> str:
    """How the case was simulated, from its summary: folded exactly, folded though not exact (`fold_not_exact`:
    which fold and why, and the widest gap between the ends of one out-of-step instance's copies, `widest_s`) or
    unfolded, with the ranks simulated of its GPUs and each fold given up on the way
    (`fold_given_up`: which and why)."""
    ranks, gpus = summary["simulated_ranks"], summary["gpus"]
    not_exact = summary.get("fold_not_exact")
    if not summary["folded"]:
        how = f"unfolded, all {gpus:,} ranks"
    elif not_exact:
        bound = f", by up to {not_exact['out_of_step']['widest_s'] * 1e3:.3g} ms" if "out_of_step" in not_exact else ""
        how = f"folded by {not_exact['fold']}, not exact ({not_exact['why']}{bound}), {ranks:,} of {gpus:,} ranks"
    else:
        how = f"folded exactly, {ranks:,} of {gpus:,} ranks"
    given_up = [f"{entry['fold']} fold given up: {entry['why']}" for entry in summary.get("fold_given_up") or ()]
    return how + (f" ({'; '.join(given_up)})" if given_up else "")


def _contention(entry: dict | None) -> str:
    """The compute seconds per GPU lost while communication held SMs, in all and by kind."""
    if entry is None:
        return "off"
    kinds = ", ".join(f"{kind} {seconds:.2f}" for kind, seconds in entry["compute_slowdown_s"].items() if seconds)
    return f"{entry['total_compute_slowdown_s']:.2f} s" + (f" ({kinds})" if kinds else "")


def run_case(path: Path) -> CaseResult:
    """Simulate one case file and compare it with its published figure."""
    from simulator import load_scenario, simulate

    loaded = load_scenario(str(path), [])
    published = loaded.scenario.published
    if published is None:
        raise ScenarioError(f"{path.name} has no published section", field="published", file=str(path),
                            allowed="source, metric, value, tolerance, fitted")
    summary = simulate(loaded).summary
    return CaseResult(case=path.stem, source=published.source, metric=published.metric, published=published.value,
                      simulated=_simulated(loaded, summary, published.metric), tolerance=published.tolerance,
                      fitted=published.fitted, facts=_facts(summary))


def run_cases(paths: list[Path], workers: int = 1) -> list[CaseResult]:
    """Every case, in ``workers`` worker processes (0: one per usable core, `machine.usable_cores`); results in
    the order of ``paths``. Ctrl-C or SIGTERM ends the workers (`PoolExecutor.close`) rather than waiting for
    the cases they run."""
    from simulator.sweep.executors import PoolExecutor

    workers = workers or usable_cores()
    if workers == 1:
        return [run_case(path) for path in paths]
    executor = PoolExecutor(workers)
    by_case: dict[str, CaseResult] = {}
    try:
        for result in executor.map_unordered(run_case, paths):
            by_case[result.case] = result
    except WorkerKilled:
        unfinished = ", ".join(path.stem for path in paths if path.stem not in by_case)
        raise ExecutorError(f"a worker process was killed (out of memory?) before these cases finished: "
                            f"{unfinished}; rerun them one at a time with --workers 1 --case NAME") from None
    finally:
        executor.close()
    return [by_case[path.stem] for path in paths]


UNITS = {"tflops_per_gpu": "TFLOP/s per GPU (6N + causal attention)",
         "megatron_tflops_per_gpu": "TFLOP/s per GPU (Megatron formula)", "busbw_gbps": "busbw GB/s"}

CHECKS = (
    ("ring, tree, hierarchical, halving-doubling, direct collectives", "tests/test_collectives.py",
     "alpha-beta forms (Thakur, Rabenseifner and Gropp 2005; NCCL's double binary tree)", "0.5%"),
    ("max-min fair sharing, latency, efficiency", "tests/test_network.py",
     "hand-computed progressive filling, reference implementations", "1e-9 relative"),
    ("seed 000 / 003 gradient all-reduces at line rate", "tests/test_scenarios_comm.py",
     "2 (p-1) a + 2 (p-1)/p n / B", "2-5%"),
    ("GPipe, 1F1B, interleaved bubbles; ZB-H1 idle", "tests/test_schedules.py, tests/test_training_step.py",
     "(p-1)/(m+p-1), (p-1)/(m v+p-1), (p-1)(F+B-W)", "1e-3 relative"),
    ("schedule orders at p = 4, m = 8", "tests/test_schedules.py", "tests/data/schedules_p4_m8.txt", "exact"),
    ("kernel FLOPs against the Megatron formula", "tests/test_cost_model.py", "SC21 96 B s l h^2 (...)",
     "0.5% (2% flash)"),
    ("kernel calibration (GEMM waves, gradient accumulation, optimizer passes, apex LayerNorm, 2021 backward "
     "passes), TP and DP overlap", "tests/test_calibration.py",
     "simulator/catalog/kernels.yaml sources; Megatron-LM 2021 code; closed forms of the overlap",
     "stated per test"),
    ("ZeRO model-state memory, activations; Llama 3 405B layouts in H100 memory", "tests/test_memory.py",
     "seeds 000 / 003, ZeRO paper, Korthikanti et al.; Llama 3 dimensions; 81,559 MiB per H100",
     "1% (ZeRO tables); exact (1e-12) for activations and the Llama 3 parts"),
    ("compute slowed while communication kernels hold SMs; folded equals unfolded under it",
     "tests/test_sm_contention.py", "T + L n / SMs for a kernel overlapped for L by kernels holding n SMs; "
     "NCCL channel counts (kernels.yaml nccl)", "1e-12 relative"),
    ("NVLink per GPU: ring all-reduce busbw on 8 A100 / H100, NVLS all-reduce busbw on 5-8 H100",
     "tests/test_nvlink_calibration.py", "nccl-tests issues #149 and #212, NCCL issue #1455; NCCL's tuner "
     "nvlsEfficiency (kernels.yaml nccl-nvlink, nccl-nvls)", "0.5% (ring), 2.5% (NVLS)"),
)
"""Checks against closed forms and worked figures: (what, test, reference, tolerance)."""


def render(results: list[CaseResult]) -> str:
    """docs/validation.md: the cases table, each case's run facts, and the closed-form checks."""
    lines = [
        "# Validation: simulated vs published",
        "",
        "Generated by `trainsim validate-published` from the scenarios in `scenarios/published/`; do not edit by",
        "hand. Each scenario's `published:` section names the measurement, its source, the tolerance the tests",
        "allow and what, if anything, was fitted on it. Kernel efficiencies come from kernel microbenchmarks",
        "(`simulator/catalog/kernels.yaml`), never from these tables.",
        "",
        "| case | published | simulated | error | tolerance | fitted on it | source |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        mark = "" if r.within else " (outside)"
        lines.append(f"| {r.case} | {r.published:g} {UNITS[r.metric]} | {r.simulated:.1f} | {r.error:+.1%}{mark} | "
                     f"{r.tolerance:.0%} | {r.fitted} | {r.source} |")
    groups: dict[str, list[CaseResult]] = {}
    for r in results:
        groups.setdefault(r.metric, []).append(r)
    lines.append("")
    for metric, rows in groups.items():
        mean = sum(abs(r.error) for r in rows) / len(rows)
        worst = max(rows, key=lambda r: abs(r.error))
        lines.append(f"- {UNITS[metric]}: {len(rows)} cases, mean absolute error {mean:.1%}, worst {worst.case} "
                     f"({worst.error:+.1%}).")
    lines.append(f"- {outside_summary(results)}.")
    steps = [r for r in results if r.facts[0][0] == "step"]
    if steps:
        lines += ["", "## Where the time goes", "", "| case | " + " | ".join(k for k, _ in steps[0].facts) + " |",
                  "|---" * (len(steps[0].facts) + 1) + "|"]
        lines += [f"| {r.case} | " + " | ".join(value for _, value in r.facts) + " |" for r in steps]
    lines += ["", "## Checks against closed forms and worked figures", "",
              "Tests, not published runs: each compares the simulation with an exact form or a seed's figure.", "",
              "| what | test | reference | tolerance |", "|---|---|---|---|"]
    lines += [f"| {what} | `{test}` | {reference} | {tolerance} |" for what, test, reference, tolerance in CHECKS]
    return "\n".join(lines) + "\n"
