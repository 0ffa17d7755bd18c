"""What a parameter-server run reports, read back from its event log: throughput while every worker trains,
each worker's iteration times, the traffic the servers moved per iteration, how busy the servers' and the
workers' network links were and which of the two bind the exchange, how stale the applied gradients were and
how far workers ran ahead of the slowest.

Definitions (docs/parameter_server.md):
- iteration time of a worker: from the start of its forward to the end of its last pull of that iteration;
  its exchange time from the end of its backward to that pull's end (pushes, waiting, updates, pulls).
- throughput: the samples every worker trained before the first worker finished all of its iterations,
  over that time (after it, fewer workers train), an iteration under way counting its elapsed share: under
  sync the workers' last pulls end nanoseconds apart, and counting whole iterations dropped every one that
  ended after the first worker's.
- staleness of a gradient: updates a server GPU applied between reading the parameters the gradient was
  computed on (the start of the worker's previous pull) and starting to apply it; the largest over the server
  GPUs. Sync applies one update per iteration after every push is in, so its staleness is 0.
- lag: when a worker starts iteration j, j minus the iterations the slowest worker has completed (its update
  applied on every server GPU); SSP keeps it at most k.
- server link: per server GPU the slowest network link every push to it crosses, the nearest the GPU among
  equally slow ones (and its reverse for pulls; where pushes rerouted around a failed link share none, the
  slowest of the last links they arrive by); utilisation is the bytes the run moved over it divided by what its
  line rate carries in the run, and in transfers, in the time the transfers crossing it run (the rule of a
  step's link tiers, metrics/link_tiers.py `transfers_crossing`: a push or pull is one flow, so the time some
  push or pull is under way on it). A worker link is the same from a worker GPU's pushes. A side's links bind
  the exchange where its busiest one runs near the peak link (`link_tiers.near_peak`, the tiers' test), the
  link any push or pull crosses that runs nearest line rate in transfers: one side, both, or neither (then the
  fabric between them binds, the peak link named). The step's `link_tiers` name the same links: the DP
  transfers' NIC-leaf tier, its busiest link a server's.
- the all-reduce it is compared with: one ring all-reduce of the same gradient over the same workers, simulated
  alone on the same cluster, as built (a step's link faults do not carry over), and network settings (the
  program's `PsPlan.comparison`, which simulation.py runs after the step and hands in); its bytes in total,
  per worker and on its busiest link, against the servers' per iteration (seed 001: 2 x workers x parameters
  through the servers, against about 2 x parameters per worker spread over every link of the ring).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from simulator.metrics.events import COLLECTIVE_KIND, COMPUTE_KIND, FLOW_KIND
from simulator.metrics.intervals import covered
from simulator.metrics.link_tiers import near_peak, transfers_crossing
from simulator.program.ops import BACKWARD_CATEGORY, FORWARD_CATEGORY
from simulator.program.ps_plan import PsPlan
from simulator.topology.graph import Topology

if TYPE_CHECKING:
    from simulator.engine.engine import EngineResult


def ps_report(plan: PsPlan, frame: pd.DataFrame, routes: list[tuple[int, ...]], topology: Topology,
              makespan_s: float, comparison: EngineResult) -> dict:
    """The `parameter_server` summary entry of a run, with the ring all-reduce it is compared with
    (``comparison``: the run of ``plan.comparison`` alone on the cluster)."""
    report = ps_summary(plan, frame, routes, topology, makespan_s)
    report["allreduce"] = allreduce_figures(comparison, len(plan.workers))
    return report


def allreduce_figures(result: EngineResult, workers: int) -> dict:
    """The compared ring all-reduce's time and bytes: in total, per worker and on its busiest link."""
    flows = result.log.to_frame()
    flows = flows[flows["kind"] == FLOW_KIND]
    carried = _carried(flows["bytes"].to_numpy(), result.log.flow_routes())
    return {"algorithm": "ring", "time_s": result.makespan_s, "total_bytes": float(flows["bytes"].sum()),
            "bytes_per_worker": float(flows["bytes"].sum()) / workers,
            "busiest_link_bytes": max(carried.values(), default=0.0)}


def _carried(nbytes: np.ndarray, routes: list[tuple[int, ...]]) -> Counter[int]:
    """Bytes over each directed link of the flows (``nbytes`` and ``routes`` aligned)."""
    carried: Counter[int] = Counter()
    for size, route in zip(nbytes.tolist(), routes):
        for link in route:
            carried[link] += size
    return carried


def ps_summary(plan: PsPlan, frame: pd.DataFrame, routes: list[tuple[int, ...]], topology: Topology,
               makespan_s: float) -> dict:
    """The plan's summary entries and the figures measured in its run."""
    workers, endpoints, n = list(plan.workers), list(plan.endpoints), plan.iterations
    keys = list(plan.transfers)
    ops = frame[frame["kind"] != FLOW_KIND]
    transfers = ops[(ops["kind"] == COLLECTIVE_KIND) & ops["key"].isin(keys)].drop_duplicates("key")
    described = [plan.transfers[key] for key in transfers["key"]]
    transfers = transfers.assign(pull=[t.pull for t in described], iteration=[t.iteration for t in described],
                                 worker=[t.worker for t in described], endpoint=[t.endpoint for t in described])
    pulls = transfers[transfers["pull"]]
    pull_end = pulls.groupby(["worker", "iteration"])["end_s"].max()
    forwards = ops[ops["category"] == FORWARD_CATEGORY].set_index(["rank", "microbatch"])["start_s"]
    backwards = ops[ops["category"] == BACKWARD_CATEGORY].set_index(["rank", "microbatch"])["end_s"]
    iteration_s = {w: [float(pull_end[(w, i)] - forwards[(w, i)]) for i in range(n)] for w in workers}
    exchange_s = [float(pull_end[(w, i)] - backwards[(w, i)]) for w in workers for i in range(n)]
    first_done = float(min(pull_end[(w, n - 1)] for w in workers))
    done = sum(_progress(first_done, [float(forwards[(w, i)]) for i in range(n)],
                         [float(pull_end[(w, i)]) for i in range(n)]) for w in workers)
    samples = done * plan.samples_per_iteration / len(workers)
    flows = frame[frame["kind"] == FLOW_KIND]
    flows = flows.assign(flow=np.arange(len(flows)))
    is_ps = flows["key"].isin(keys).to_numpy()
    per_iteration = float(flows.loc[is_ps, "bytes"].sum()) / n
    carried = _carried(np.where(is_ps, flows["bytes"].to_numpy(), 0.0), routes)
    staleness = _staleness(ops, pulls, workers, endpoints, n, plan.update_owner)
    lag = _lag(ops, forwards, workers, n, plan.sync, plan.update_owner)
    means = [float(np.mean(times)) for times in iteration_s.values()]
    in_transfers = _in_transfers_s(flows[is_ps], routes)
    servers = _server_links(flows[is_ps], routes, carried, in_transfers, topology, endpoints, makespan_s)
    workers_links = _worker_links(flows[is_ps], routes, carried, in_transfers, topology, workers, makespan_s)
    peak = peak_link(carried, in_transfers, topology)
    return {
        **plan.entries,
        "samples_per_s": samples / first_done if first_done > 0 else 0.0,
        "tokens_per_s": samples * plan.tokens_per_sample / first_done if first_done > 0 else 0.0,
        "throughput_window_s": first_done,
        "iteration_s": {"mean": float(np.mean(means)), "min": float(np.min(means)), "max": float(np.max(means))},
        "worker_iteration_s": {str(w): float(np.mean(times)) for w, times in iteration_s.items()},
        "exchange_s": float(np.mean(exchange_s)),
        "server_traffic_bytes_per_iteration": per_iteration,
        "busiest_link_bytes_per_iteration": max(carried.values(), default=0.0) / n,
        "server_links": servers,
        "worker_links": workers_links,
        "peak_link": peak,
        "binding_links": binding_links(servers, workers_links, peak),
        "staleness_histogram": histogram(staleness),
        "max_staleness": max(staleness),
        "lag_histogram": histogram(lag),
        "max_lag": max(lag),
    }


def _progress(at: float, starts: list[float], ends: list[float]) -> float:
    """The iterations a worker has done at time ``at``: those ended by then and the elapsed share of the one
    under way (its forward's start to its last pull's end)."""
    done = sum(end <= at for end in ends)
    if done == len(ends) or starts[done] >= at:
        return float(done)
    return done + (at - starts[done]) / (ends[done] - starts[done])


def histogram(values: list[int]) -> list[int]:
    """Counts of 0, 1, 2, ... up to the largest value (a list keeps its order in JSON)."""
    counts = Counter(values)
    return [counts.get(value, 0) for value in range(max(values) + 1)]


def _updates(ops: pd.DataFrame, update_owner: Mapping[str, int | None]) -> pd.DataFrame:
    """The server updates' rows (not the sums that precede sync's)."""
    return ops[(ops["kind"] == COMPUTE_KIND) & ops["name"].isin(list(update_owner))]


def _staleness(ops: pd.DataFrame, pulls: pd.DataFrame, workers: list[int], endpoints: list[int],
               n: int, update_owner: Mapping[str, int | None]) -> list[int]:
    """Per (worker, iteration): updates applied between its read and the start of its gradient's update."""
    read = pulls.set_index(["worker", "iteration", "endpoint"])["start_s"]
    worst = {(w, i): 0 for w in workers for i in range(n)}
    every_update = _updates(ops, update_owner)
    for e in endpoints:
        updates = every_update[every_update["rank"] == e].sort_values("start_s")
        ends = np.sort(updates["end_s"].to_numpy())
        for name, start, i in zip(updates["name"].tolist(), updates["start_s"].tolist(),
                                  updates["microbatch"].tolist()):
            owner = update_owner[name]
            for w in workers if owner is None else [owner]:
                read_at = float(read[(w, i - 1, e)]) if i > 0 else 0.0
                behind = int(np.searchsorted(ends, start, "right") - np.searchsorted(ends, read_at, "right"))
                worst[(w, i)] = max(worst[(w, i)], behind)
    return list(worst.values())


def _lag(ops: pd.DataFrame, forwards: pd.Series, workers: list[int], n: int, sync: bool,
         update_owner: Mapping[str, int | None]) -> list[int]:
    """Per (worker, iteration j): j minus the iterations the slowest worker had completed when j started."""
    updates = _updates(ops, update_owner)
    if sync:
        per_iteration = updates.groupby("microbatch")["end_s"].max()
        completed_at = {w: [float(per_iteration[i]) for i in range(n)] for w in workers}
    else:
        owner = updates["name"].map(update_owner).astype(int)
        ends = updates.assign(worker=owner).groupby(["worker", "microbatch"])["end_s"].max()
        completed_at = {w: [float(ends[(w, i)]) for i in range(n)] for w in workers}
    cumulative = {w: np.maximum.accumulate(times) for w, times in completed_at.items()}
    lags = []
    for w in workers:
        for j in range(n):
            start = float(forwards[(w, j)])
            slowest = min(int(np.searchsorted(cumulative[other], start, "right")) for other in workers)
            lags.append(j - slowest)
    return lags


def _server_links(flows: pd.DataFrame, routes: list[tuple[int, ...]], carried: Counter[int],
                  in_transfers: Mapping[int, float], topology: Topology, endpoints: list[int], makespan_s: float
                  ) -> dict:
    """Per server GPU the slowest link (by line rate) on every push's route into it and its reverse, with their
    utilisation of line rate, degraded or not, over the run and while their transfers run (``flows`` are the
    pushes and pulls, numbered by their position among every flow row in ``flow``). Pushes rerouted around a
    failed link may share none: then the slowest of the last links they arrive by."""
    return _gpu_links(flows, routes, carried, in_transfers, topology, {e: flows["dst"] == e for e in endpoints}, -1,
                      makespan_s, ("ingress", "egress"), "per_server_gpu")


def _worker_links(flows: pd.DataFrame, routes: list[tuple[int, ...]], carried: Counter[int],
                  in_transfers: Mapping[int, float], topology: Topology, workers: list[int], makespan_s: float
                  ) -> dict:
    """Per worker GPU the slowest link on every push's route out of it and its reverse, as `_server_links`
    gives the servers' (the first links its pushes leave by where they share none)."""
    return _gpu_links(flows, routes, carried, in_transfers, topology, {w: flows["src"] == w for w in workers}, 0,
                      makespan_s, ("egress", "ingress"), "per_worker_gpu")


def _gpu_links(flows: pd.DataFrame, routes: list[tuple[int, ...]], carried: Counter[int],
               in_transfers: Mapping[int, float], topology: Topology, pushes: Mapping[int, pd.Series], end: int,
               makespan_s: float, directions: tuple[str, str], key: str) -> dict:
    """Per GPU the slowest link every one of its ``pushes`` (a mask of ``flows`` per GPU) crosses, the one
    nearest the GPU (route position ``end``) among equally slow ones, so that the NIC of a lone worker that
    every push to a server crosses is the worker's link, not the server's; else the slowest of their links at
    route position ``end``; and its reverse, which the pulls cross; their utilisation named by ``directions``
    (the push's, the pull's), over the run (`*_utilisation`) and while a transfer runs over them
    (`*_utilisation_in_transfers`: bytes over line rate x the time some push or pull is under way on the
    link), with the means of both over every entry."""
    per_gpu: dict[str, dict] = {}
    shares: list[float] = []
    busy: list[float] = []
    for gpu, mask in pushes.items():
        own = flows[mask]["flow"]
        if own.empty:
            continue
        taken = [routes[index] for index in own]
        common = set.intersection(*(set(route) for route in taken)) or {route[end] for route in taken}
        route = taken[0]
        hops = {k: len(route) - 1 - position if end < 0 else position for position, k in enumerate(route)}
        link = min(common, key=lambda k: (topology.line_rate[k], hops.get(k, 0), k))
        u, v = topology.link_ends[link]
        back = topology.link_index[(v, u)]
        rate = topology.line_rate[link]
        figures: dict[str, float] = {}
        for direction, crossed in zip(directions, (link, back), strict=True):
            for name, span in (("", makespan_s), ("_in_transfers", in_transfers.get(crossed, 0.0))):
                figures[f"{direction}_utilisation{name}"] = carried[crossed] / (rate * span) if rate * span else 0.0
        per_gpu[str(gpu)] = {"link": f"{u}->{v}", "bandwidth_bytes_per_s": float(rate), **figures}
        shares += [figures["ingress_utilisation"], figures["egress_utilisation"]]
        busy += [figures["ingress_utilisation_in_transfers"], figures["egress_utilisation_in_transfers"]]
    return {"mean_utilisation": float(np.mean(shares)) if shares else 0.0,
            "mean_utilisation_in_transfers": float(np.mean(busy)) if busy else 0.0,
            "busiest_utilisation_in_transfers": max(busy, default=0.0), key: per_gpu}


def _crossing(flows: pd.DataFrame, routes: list[tuple[int, ...]]) -> defaultdict[int, list[int]]:
    """The rows of ``flows`` over each directed link (``flows["flow"]`` numbers them among ``routes``)."""
    crossing: defaultdict[int, list[int]] = defaultdict(list)
    for row, index in enumerate(flows["flow"].tolist()):
        for link in routes[index]:
            crossing[link].append(row)
    return crossing


def _in_transfers_s(flows: pd.DataFrame, routes: list[tuple[int, ...]]) -> dict[int, float]:
    """Per directed link the pushes and pulls (``flows``) cross, the time the transfers crossing it run
    (`link_tiers.transfers_crossing`, the rule of a step's link tiers: each push and pull is one flow, so the
    time some push or pull is under way on it)."""
    starts, ends = flows["start_s"].to_numpy(), flows["end_s"].to_numpy()
    keys = flows["key"].to_numpy()
    return {link: covered(starts[rows], ends[rows])
            for link, over in _crossing(flows, routes).items()
            for rows in [transfers_crossing(keys, np.asarray(over))]}


def peak_link(carried: Counter[int], in_transfers: Mapping[int, float], topology: Topology) -> dict:
    """Of every directed link the pushes and pulls cross (``in_transfers``: the time the transfers crossing each
    run), the one that runs nearest its line rate while they do: its name and that utilisation (the figure
    `_gpu_links` gives a GPU's link)."""
    best, name = 0.0, ""
    for link, span_s in sorted(in_transfers.items()):
        span = topology.line_rate[link] * span_s
        share = carried[link] / span if span else 0.0
        if share > best:
            u, v = topology.link_ends[link]
            best, name = float(share), f"{u}->{v}"
    return {"link": name, "utilisation_in_transfers": best}


BindingSide = Literal["server", "worker", "both", "neither"]


def binding_links(server_links: Mapping, worker_links: Mapping, peak: Mapping) -> BindingSide:
    """Which side's links bind the exchange: a side whose busiest link runs near the peak link (`near_peak`,
    ``peak``, the link nearest line rate while pushes and pulls cross it) sets the exchange's pace; both
    sides where both do; neither where only links in the fabric between them come that near. The busiest link,
    not the mean: shards of unequal size load one server GPU's link more than the others'."""
    near = [side for side, links in (("server", server_links), ("worker", worker_links))
            if near_peak(links["busiest_utilisation_in_transfers"], peak["utilisation_in_transfers"])]
    if len(near) == 2:
        return "both"
    if not near:
        return "neither"
    return "server" if near == ["server"] else "worker"


def with_binding_links(bottleneck: dict, report: Mapping) -> dict:
    """The run's bottleneck with the links that bind its exchange named in its verdict where communication
    binds ('...; the server links bind: their busiest runs at 94.0% of line rate while pushes and pulls cross it,
    the workers' busiest 31.3%'), so that a run held by one server host's NICs does not read like one held by
    the workers' own, or by the fabric between them."""
    if bottleneck.get("constraint") != "communication" or "verdict" not in bottleneck:
        return bottleneck
    side = report["binding_links"]
    servers, workers = (report[f"{name}_links"]["busiest_utilisation_in_transfers"] for name in ("server", "worker"))
    if side == "both":
        note = (f"the server and worker links both bind: their busiest run at {servers:.1%} and {workers:.1%} of "
                "line rate while pushes and pulls cross them")
    elif side == "neither":
        peak = report["peak_link"]
        note = (f"neither side's links bind: the busiest server link runs at {servers:.1%} of line rate while pushes "
                f"and pulls cross it, the workers' {workers:.1%}, and the fabric between them binds "
                f"({peak['link']} at {peak['utilisation_in_transfers']:.1%})")
    else:
        bound, spare = (servers, workers) if side == "server" else (workers, servers)
        other = "worker" if side == "server" else "server"
        note = (f"the {side} links bind: their busiest runs at {bound:.1%} of line rate while pushes and pulls "
                f"cross it, the {other}s' busiest {spare:.1%}")
    return {**bottleneck, "verdict": f"{bottleneck['verdict']}; {note}"}

