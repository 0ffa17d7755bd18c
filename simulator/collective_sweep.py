"""`trainsim collective`: time one collective over a range of sizes, reported as nccl-tests does."""

from __future__ import annotations

from collections.abc import Callable

from simulator.collectives.busbw import bus_bandwidth_factor
from simulator.collectives.chunking import chunk_bytes
from simulator.collectives.names import ALGORITHM_CHOICES, POINT_TO_POINT, PRIMITIVES, PROTOCOL_CHOICES
from simulator.collector import collector_paused
from simulator.errors import ScenarioError
from simulator.network.calibration import resolve_efficiency
from simulator.network.modes import NetworkMode
from simulator.program.ops import COMM_STREAM, CollectiveOp
from simulator.simulation import NetworkSettings, plan_cache, run_ops
from simulator.topology.graph import Topology
from simulator.topology.loader import TopologySource, build_source, read_topology, with_overrides
from simulator.units import format_size


@collector_paused()
def collective_sweep(cluster: str | TopologySource | Topology, overrides: dict, *, op: str, algorithm: str, ranks: int,
                     sizes: list[float], efficiency: str = "calibrated", mode: NetworkMode = "flow",
                     chunk: str | None = "auto", protocol: str = "auto", pxn: bool = True,
                     progress: Callable[[int, int], None] | None = None, explain: bool = False) -> list[dict]:
    """One row per size: op, algorithm and protocol (as asked), resolved_algorithm and resolved_protocol (the ones
    that ran: `auto`'s choice for this size, as NCCL_DEBUG=INFO names the algorithm and protocol NCCL's tuner
    picked), ranks, bytes (a whole number; ``sizes`` are whole bytes), time_s, algbw_GBps, busbw_GBps (GB = 1e9
    bytes); a send_recv's also its src and dst GPUs (GPU 0 to GPU ``ranks`` - 1: ``ranks`` picks the receiver, two
    ranks run). The cyclic garbage collector is paused meanwhile (simulator/collector.py). ``op``, ``algorithm`` and
    ``protocol`` come from the command line, so they are checked here, against the sets the schema checks a
    scenario's against. ``cluster``: a topology's name or path, its file already read, or built (`trainsim
    collective` reads it once, to count its GPUs before building, and builds it, to warn of a GPU changed without
    its NVLink); ``overrides`` replace the parameters of a name, a path or a file read. ``pxn`` lets an all-to-all's
    cross-rail transfers between hosts go through PXN relays (`--pxn`). ``progress(done, total)`` hears each size
    begin, and the end. With ``explain``, each row's `auto` says why `auto` picked what ran (`Weighing.report`: the
    rule, every candidate's estimate, the pick), None where nothing was weighed (a send_recv, an all_to_all left to
    `auto`: point to point; an algorithm and protocol given)."""
    if op not in PRIMITIVES:
        raise ScenarioError(f"unknown collective {op!r}", field="op", allowed=", ".join(PRIMITIVES))
    if algorithm not in ALGORITHM_CHOICES:
        raise ScenarioError(f"unknown algorithm {algorithm!r}", field="collectives.algorithm",
                            allowed=", ".join(ALGORITHM_CHOICES))
    if protocol not in PROTOCOL_CHOICES:
        raise ScenarioError(f"unknown protocol {protocol!r}", field="collectives.protocol",
                            allowed=", ".join(PROTOCOL_CHOICES))
    topology = cluster if isinstance(cluster, Topology) else build_source(
        with_overrides(read_topology(cluster) if isinstance(cluster, str) else cluster, overrides))
    if topology.num_gpus < 2:
        raise ScenarioError(f"{topology.name} has {topology.num_gpus} GPU: a collective needs two or more",
                            field="--topology", allowed="a topology of 2 GPUs or more")
    ranks = ranks or topology.num_gpus
    if ranks < 2:
        raise ScenarioError(f"{ranks} rank: a collective needs two or more", field="--ranks",
                            allowed=f"2..{topology.num_gpus:,}")
    if ranks > topology.num_gpus:
        raise ScenarioError(f"{ranks:,} ranks do not fit {topology.name} ({topology.num_gpus:,} GPUs)",
                            field="--ranks", allowed=f"2..{topology.num_gpus:,}")
    fractions = resolve_efficiency(efficiency, topology.gpu_model, "--efficiency")
    settings = NetworkSettings(mode=mode, efficiency=tuple(sorted(fractions.items())), algorithm=algorithm,
                               chunk_bytes=chunk_bytes(chunk), protocol=protocol, pxn=pxn)
    group = tuple(range(ranks))
    if op == "send_recv":
        group = (0, ranks - 1)
    rows = []
    for done, nbytes in enumerate(sizes):
        if progress is not None:
            progress(done, len(sizes))
        ops = [CollectiveOp(id=i, rank=rank, stream=COMM_STREAM, name=op, op=op, group=group, nbytes=nbytes,
                            key=op, algorithm=algorithm, protocol=protocol) for i, rank in enumerate(group)]
        plans = plan_cache(topology, settings)  # each size's own: kept, every size's plans held at once
        result, _ = run_ops(topology, ops, settings, plans=plans)
        time_s = result.makespan_s
        algbw = nbytes / time_s / 1e9
        ran = plans.resolved(ops[0], group)
        optional: dict[str, object] = {"src": group[0], "dst": group[-1]} if op == "send_recv" else {}
        if explain:
            weighing = plans.weighing(ops[0], group)
            optional["auto"] = None if weighing is None else weighing.report()
        rows.append({"op": op, "algorithm": algorithm, "resolved_algorithm": ran.algorithm, "protocol": protocol,
                     "resolved_protocol": ran.protocol, "ranks": len(group), **optional, "bytes": round(nbytes),
                     "time_s": time_s, "algbw_GBps": algbw, "busbw_GBps": algbw * bus_bandwidth_factor(op, len(group))})
    if progress is not None:
        progress(len(sizes), len(sizes))
    return rows


def format_table(rows: list[dict]) -> str:
    """An nccl-tests-like table: size, time (us), algbw and busbw (GB/s), and the algorithm and protocol that
    ran; its title names the ranks that ran (a send_recv's two GPUs)."""
    header = (f"{'size':>12} {'bytes':>14} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}  "
              f"{'algorithm':<16} protocol")
    lines = [_title(rows[0]) if rows else "", header]
    for row in rows:
        lines.append(f"{format_size(row['bytes']):>12} {int(row['bytes']):>14d} {row['time_s'] * 1e6:>12.2f} "
                     f"{row['algbw_GBps']:>13.2f} {row['busbw_GBps']:>13.2f}  {row['resolved_algorithm']:<16} "
                     f"{row['resolved_protocol']}")
    if rows and "auto" in rows[0]:
        lines += explanation(rows)
    return "\n".join(lines)


def explanation(rows: list[dict]) -> list[str]:
    """`--explain`'s table under the sweep's: the rule `auto` picks by, then per size every candidate algorithm
    and protocol with its estimate (us), the pick marked, or what ran without weighing and why."""
    weighed = next((row["auto"] for row in rows if row["auto"] is not None), None)
    lines = ["", f"# why auto picked: {weighed['rule'] if weighed else 'nothing weighed'}",
             f"{'size':>12}  {'algorithm':<16} {'protocol':<9} {'estimate (us)':>14}"]
    for row in rows:
        size = format_size(row["bytes"])
        if row["auto"] is None:
            why = "point to point" if row["op"] in POINT_TO_POINT else "asked for"
            lines.append(f"{size:>12}  {row['resolved_algorithm']:<16} {row['resolved_protocol']:<9} "
                         f"{'-':>14}  nothing weighed: {why}")
            continue
        picked = (row["auto"]["algorithm"], row["auto"]["protocol"])
        lines += [f"{size:>12}  {each['algorithm']:<16} {each['protocol']:<9} {each['estimate_s'] * 1e6:>14.2f}"
                  + ("  <- picked" if (each["algorithm"], each["protocol"]) == picked else "")
                  for each in row["auto"]["candidates"]]
    return lines


def _title(row: dict) -> str:
    """The table's first line: the op, the algorithm and protocol asked, and the ranks that ran."""
    ends = f" (GPU {row['src']} -> GPU {row['dst']})" if "src" in row else ""
    return f"# {row['op']} algorithm={row['algorithm']} protocol={row['protocol']} ranks={row['ranks']}{ends}"
