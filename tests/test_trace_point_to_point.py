"""Traced point-to-point transfers as the modelled pipeline runs them: a rank's sends to one peer over one
process group leave in issue order (program/send_order.py).

Expected figures: a transfer between two single-GPU hosts of ethernet-100g waits the path's latency (7 us per
NIC, `test_traces.transfer_s`) and then streams its bytes at the Ethernet link's rate times the calibrated 0.94;
flows crossing one link share it max-min fairly, so two of them on a NIC's uplink get half its rate each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_traces import EXACT, run

MIB = 1 << 20
NIC_BITS = 25e9
RATE = NIC_BITS / 8 * 0.94
"""Bytes per second of a 25 Gb/s Ethernet NIC at the calibrated Ethernet efficiency."""
LATENCY = 2 * 7e-6
"""GPU to GPU through the one switch of ethernet-100g."""


def transfer_nodes(ends: list[tuple[str, int, int]], groups: list[str] | None = None) -> list[dict]:
    """Chakra nodes of one rank's sends and receives, ("send" or "recv", peer, bytes) each, none depending on
    another (the trace issues them at once); ``groups``: each one's pg_name, none where not given."""
    nodes = []
    for number, (kind, peer, nbytes) in enumerate(ends, start=1):
        attrs = [{"name": "comm_size", "int64Val": nbytes},
                 {"name": "comm_dst" if kind == "send" else "comm_src", "int32Val": peer}]
        if groups is not None:
            attrs.append({"name": "pg_name", "stringVal": groups[number - 1]})
        nodes.append({"id": number, "name": f"{kind} {number}", "type": f"COMM_{kind.upper()}_NODE", "attr": attrs})
    return nodes


def three_hosts(folder: Path, ranks: dict[int, list[dict]]) -> str:
    """``ranks``' Chakra files in ``folder`` on three single-GPU hosts of 25 Gb/s Ethernet; the scenario."""
    for rank, nodes in ranks.items():
        (folder / f"rank{rank}.json").write_text(json.dumps(nodes))
    return (f"cluster: {{topology: ethernet-100g, nodes: 3, nic_bandwidth: 25 Gb/s}}\n"
            f"workload: {{trace: '{folder}/rank*.json', format: chakra-json}}\n")


def flow_times(result) -> list[tuple[int, int, float, float, float]]:
    """(src, dst, bytes, start, end) of each flow (its start: the transfer's, before its latency), by start then
    destination."""
    flows = result.timeline[result.timeline["kind"] == "flow"]
    return sorted(zip(flows["src"], flows["dst"], flows["bytes"], flows["start_s"], flows["end_s"], strict=True),
                  key=lambda flow: (flow[3], flow[1]))


def test_traced_sends_to_one_peer_leave_one_after_another_while_a_send_to_another_peer_overlaps(tmp_path):
    """Rank 0 issues at once a send of 1 MiB and one of 2 MiB to rank 1 and one of 1 MiB to rank 2. The first
    send to rank 1 and the send to rank 2 wait their latency and share rank 0's uplink at half its rate, both
    ending at L + 2 MiB / r; the second send to rank 1 starts then, waits its latency and streams alone, ending
    at 2L + 4 MiB / r. (Unordered, as before, all three shared the uplink at a third each: the 1 MiB sends
    ended at L + 3 MiB / r and the 2 MiB one at L + 4 MiB / r.)"""
    text = three_hosts(tmp_path, {0: transfer_nodes([("send", 1, MIB), ("send", 1, 2 * MIB), ("send", 2, MIB)]),
                                  1: transfer_nodes([("recv", 0, MIB), ("recv", 0, 2 * MIB)]),
                                  2: transfer_nodes([("recv", 0, MIB)])})
    _, result = run(text, tmp_path)
    first_end = LATENCY + 2 * MIB / RATE
    assert flow_times(result) == [
        (0, 1, MIB, 0.0, pytest.approx(first_end, rel=EXACT)), (0, 2, MIB, 0.0, pytest.approx(first_end, rel=EXACT)),
        (0, 1, 2 * MIB, pytest.approx(first_end, rel=EXACT), pytest.approx(2 * LATENCY + 4 * MIB / RATE, rel=EXACT))]
    assert result.summary["step_time_s"] == pytest.approx(2 * LATENCY + 4 * MIB / RATE, rel=EXACT)


def test_sends_to_one_peer_over_two_process_groups_do_not_wait_for_each_other(tmp_path):
    """Two process groups are two NCCL communicators, each with its own stream: rank 0's two sends of 1 MiB to
    rank 1, one in group 'a' and one in group 'b', run at once and share the uplink, both ending at
    L + 2 MiB / r."""
    text = three_hosts(tmp_path, {0: transfer_nodes([("send", 1, MIB), ("send", 1, MIB)], ["a", "b"]),
                                  1: transfer_nodes([("recv", 0, MIB), ("recv", 0, MIB)], ["a", "b"]),
                                  2: [{"id": 1, "name": "idle", "type": "COMP_NODE", "durationMicros": 10}]})
    _, result = run(text, tmp_path)
    end = pytest.approx(LATENCY + 2 * MIB / RATE, rel=EXACT)
    assert flow_times(result) == [(0, 1, MIB, 0.0, end)] * 2

