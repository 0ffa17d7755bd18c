"""Traced point-to-point transfers as the modelled pipeline runs them: a rank's sends to one peer over one
process group leave in issue order (program/send_order.py) where the trace records no stream (Chakra), a Kineto
trace's sends keep their recorded streams, and a Chakra send or receive without `pg_name`
takes its group from where the trace determines it.

Expected figures: a transfer between two single-GPU hosts of ethernet-100g waits the path's latency (7 us per
NIC, `shared.transfer_s`) and then streams its bytes at the Ethernet link's rate times the calibrated 0.94;
flows crossing one link share it max-min fairly, so two of them on a NIC's uplink get half its rate each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared import EXACT, MIB, launched, p2p_job, run, transfer_s

from simulator.errors import TraceError

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
    """Rank 0 issues at once a send of 1 MiB and one of 2 MiB to rank 1 and one of 1 MiB to rank 2. The first send to
    rank 1 and the send to rank 2 wait their latency and share rank 0's uplink at half its rate, both ending at L + 2
    MiB / r; the second send to rank 1 starts then, waits its latency and streams alone, ending at 2L + 4 MiB / r.
    (Unordered, all three would share the uplink at a third each: the 1 MiB sends ending at L + 3 MiB / r and the 2
    MiB one at L + 4 MiB / r.)"""
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


def without_pg_name(nodes: list[dict]) -> list[dict]:
    """``nodes`` with no pg_name attribute: as a converter that leaves the group to the launching node writes them."""
    return [{**node, "attr": [attr for attr in node.get("attr", []) if attr["name"] != "pg_name"]} for node in nodes]


def test_a_chakra_transfer_without_pg_name_takes_the_group_its_launching_record_param_comms_names(tmp_path):
    """The record_param_comms node that launched each send and receive records its group's (name, description) before
    the peer's rank in the group: group '2' of ranks [1, 2, 3], so rank 1 sends to rank 2, which sends on to rank 3,
    as where the nodes name the group (test_traces): two 32 MiB transfers one after the other, each the closed form
    between two hosts; the nodes without pg_name are not refused."""
    text = p2p_job(tmp_path, {0: [{"id": 2, "name": "idle", "type": "COMP_NODE", "durationMicros": 10}],
                              1: without_pg_name(launched("send", "2", 1, 2, [])),
                              2: without_pg_name([*launched("recv", "2", 0, 2, []), *launched("send", "2", 2, 4, [3])]),
                              3: without_pg_name(launched("recv", "2", 1, 2, []))})
    _, result = run(text, tmp_path)
    flows = result.timeline[result.timeline["kind"] == "flow"]
    assert list(zip(flows["src"], flows["dst"], flows["start_s"], strict=True)) == [
        (1, 2, 0.0), (2, 3, pytest.approx(transfer_s(25e9), rel=EXACT))]
    assert result.summary["step_time_s"] == pytest.approx(2 * transfer_s(25e9), rel=EXACT)


def two_rank_job(folder: Path, groups: list[dict]) -> str:
    """Rank 0 sends 32 MiB and rank 1 receives it, then computes 100 us: nodes with neither peer nor pg_name nor a
    launching node, after process-group metadata of ``groups`` (none: no metadata node); on two single-GPU hosts
    of 25 Gb/s Ethernet. Returns the scenario."""
    meta = [{"id": 1, "name": "## process_group:init ##", "type": "METADATA_NODE",
             "inputs": {"values": str([json.dumps(groups)])}}] if groups else []
    after = {"id": 4, "name": "after", "type": "COMP_NODE", "dataDeps": [3], "durationMicros": 100}
    for rank, kind in enumerate(("send", "recv")):
        transfer = {"id": 3, "name": kind, "type": f"COMM_{kind.upper()}_NODE",
                    "attr": [{"name": "comm_size", "int64Val": 32 * MIB}]}
        (folder / f"rank{rank}.json").write_text(json.dumps([*meta, transfer, *([after] if rank else [])]))
    return (f"cluster: {{topology: ethernet-100g, nodes: 2, nic_bandwidth: 25 Gb/s}}\n"
            f"workload: {{trace: '{folder}/rank*.json', format: chakra-json}}\n")


def test_a_chakra_transfer_without_pg_name_in_a_job_of_one_process_group_is_in_that_group(tmp_path):
    """The process-group metadata of a two-rank job lists its default group alone, so the transfer is in it and its peer
    is the group's other rank: rank 0 to rank 1, the closed form between two hosts, then rank 1's 100 us; a missing
    pg_name is no refusal."""
    text = two_rank_job(tmp_path, [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [], "group_size": 2}])
    _, result = run(text, tmp_path)
    flows = result.timeline[result.timeline["kind"] == "flow"]
    assert list(zip(flows["src"], flows["dst"], flows["bytes"], strict=True)) == [(0, 1, 32 * MIB)]
    assert result.summary["step_time_s"] == pytest.approx(transfer_s(25e9) + 100e-6, rel=EXACT)


@pytest.mark.parametrize(("groups", "listed"), [
    ([], "no process-group metadata"),
    ([{"pg_name": "0", "pg_desc": "default_pg", "ranks": [], "group_size": 2},
      {"pg_name": "1", "pg_desc": "undefined", "ranks": [0, 1], "group_size": 2}],
     "the process-group metadata lists 2 groups")])
def test_a_chakra_transfer_without_pg_name_whose_group_the_trace_does_not_determine_is_refused(tmp_path, groups,
                                                                                             listed):
    """Two groups of the same two ranks (the default group and a pipeline group): either may carry the transfer,
    so it is refused at the node rather than given one; so is one of a trace without process-group metadata."""
    text = two_rank_job(tmp_path, groups)
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert (Path(caught.value.file).name, caught.value.field) == ("rank0.json", f"nodes[{1 if groups else 0}]")
    assert caught.value.problem == ("COMM_SEND_NODE 'send' has no comm_dst, and no process group: no pg_name, no "
                                    f"record_param_comms node that launched it names one, and {listed}")


def kineto_transfers(folder: Path, streams: tuple[int, int]) -> Path:
    """Kineto traces of two ranks: rank 0 sends 1 MiB to rank 1 in process group '0' twice at 0 us, on CUDA
    streams ``streams``, and rank 1 receives them on the same streams (the collective's args on the NCCL
    kernel, as recent PyTorch writes them)."""
    for rank, (kind, peer_field) in enumerate((("send", "Dst Rank"), ("recv", "Src Rank"))):
        events = [{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "pid": 0, "tid": stream, "ts": 0,
                   "dur": 100, "args": {"device": 0, "stream": stream, "Collective name": kind,
                                        "In msg nelems": MIB // 2, "Out msg nelems": MIB // 2, "dtype": "BFloat16",
                                        "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
                                        peer_field: 1 - rank}}
                  for stream in streams]
        doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
               "traceEvents": events}
        (folder / f"rank{rank}.json").write_text(json.dumps(doc))
    return folder


@pytest.mark.parametrize("streams", [(20, 30), (20, 20)], ids=["two-streams", "one-stream"])
def test_kineto_sends_keep_their_recorded_streams(tmp_path, streams):
    """A lone isend runs on the pair's NCCL stream and a batch_isend_irecv on the group's: two sends to one peer
    in one group on two recorded streams ran at once, sharing the NIC (each at half its rate, both ending at
    L + 2 MiB / r), where the send order chained them (2 (L + 1 MiB / r)); on one stream they still run one
    after the other."""
    traces = kineto_transfers(tmp_path, streams)
    text = (f"cluster: {{topology: ethernet-100g, nodes: 2, nic_bandwidth: 25 Gb/s}}\n"
            f"workload: {{trace: '{traces}/rank*.json', format: kineto}}\n")
    _, result = run(text, tmp_path)
    expected = LATENCY + 2 * MIB / RATE if streams[0] != streams[1] else 2 * (LATENCY + MIB / RATE)
    assert result.summary["step_time_s"] == pytest.approx(expected, rel=EXACT)
