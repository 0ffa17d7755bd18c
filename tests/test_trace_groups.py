"""Process groups of traced communication ops whose own records name none (workload/traces/groups.py): a
transfer's end takes the group its other ends name, a Chakra collective the group its launching
record_param_comms node or its rank's process-group metadata names, and what the traces leave open is refused
at the node.

Expected figures: a 1 MiB transfer between the two single-GPU hosts of ethernet-100g with 25 Gb/s NICs takes
the closed form `shared.transfer_s`; a two-rank ring all-reduce of n bytes sends n per GPU (2(p-1)/p x n).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared import (
    ALLREDUCE_BYTES,
    EXACT,
    KINETO_2RANK,
    MESH,
    MIB,
    chakra_scenario,
    comms_args,
    copy_traces,
    p2p_node,
    run,
    transfer_s,
    two_host_chakra_job,
    two_rank_scenario,
)

from simulator.errors import TraceError

ALL_REDUCE_BYTES = 64 * MIB


def metadata(groups: list[dict]) -> dict:
    """PyTorch's process-group metadata node as Chakra's converter keeps it (node id 100)."""
    return {"id": 100, "name": "## process_group:init ##", "type": "METADATA_NODE",
            "inputs": {"values": str([json.dumps(groups)])}}


TWO_GROUPS = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [], "group_size": 2},
              {"pg_name": "3", "pg_desc": "undefined", "ranks": [0, 1], "group_size": 2}]
ONLY_DEFAULT = TWO_GROUPS[:1]


@pytest.mark.parametrize("receiver_metadata", [[], TWO_GROUPS], ids=["no-metadata", "two-groups"])
def test_a_receive_that_names_no_group_pairs_with_the_send_that_names_one(tmp_path, receiver_metadata):
    """Rank 0's send of 1 MiB names group '3' (pg_name); rank 1's receive names none, and its metadata lists no group or
    two, so its own trace leaves the group open. Both ends are one communicator: the transfer runs in the closed form
    between the two hosts, not refused for '0 matching receives' in group '3'."""
    text = two_host_chakra_job(tmp_path, {
        0: [metadata(TWO_GROUPS), p2p_node(1, "send", 1, MIB, group="3")],
        1: [*([metadata(receiver_metadata)] if receiver_metadata else []), p2p_node(1, "recv", 0, MIB)]},
        traced_pp=2)
    _, result = run(text, tmp_path)
    flows = result.timeline[result.timeline["kind"] == "flow"]
    assert list(zip(flows["src"], flows["dst"], flows["bytes"], strict=True)) == [(0, 1, MIB)]
    assert result.summary["step_time_s"] == pytest.approx(transfer_s(25e9, MIB), rel=EXACT)
    assert result.summary["warnings"] == []


def test_a_group_named_by_the_other_end_prevails_over_the_metadata_s_only_group_with_a_warning(tmp_path):
    """Rank 1's metadata lists only the default group '0', so its receive without pg_name was taken in '0' while
    rank 0's send names '3': they did not pair. The send's own record names the communicator; the receive is
    taken in '3' (the closed-form transfer), and a warning names the node and both groups."""
    text = two_host_chakra_job(tmp_path, {0: [metadata(TWO_GROUPS), p2p_node(1, "send", 1, MIB, group="3")],
                                          1: [metadata(ONLY_DEFAULT), p2p_node(1, "recv", 0, MIB)]}, traced_pp=2)
    _, result = run(text, tmp_path)
    assert result.summary["step_time_s"] == pytest.approx(transfer_s(25e9, MIB), rel=EXACT)
    assert result.summary["warnings"] == [
        f"{tmp_path / 'rank1.json'}: nodes[1]: recv 'recv 1' is taken in process group '3', not in '0', the only "
        "group the rank's process-group metadata lists: rank 0's send (nodes[1]) between the same ranks names it"]


def test_the_ends_taken_in_a_group_the_other_ends_name_are_one_warning_per_file_and_groups(tmp_path):
    """Rank 0 sends 1 MiB three times in group '3', each after the one before; rank 1's receives name none and its
    metadata lists only '0'. The three receives are taken in '3' (three closed-form transfers in a row) and one
    warning counts them, citing the first, not one warning per receive."""
    sends = [p2p_node(node, "send", 1, MIB, group="3", deps=(node - 1,) if node > 1 else ()) for node in (1, 2, 3)]
    receives = [p2p_node(node, "recv", 0, MIB, deps=(node - 1,) if node > 1 else ()) for node in (1, 2, 3)]
    text = two_host_chakra_job(tmp_path, {0: [metadata(TWO_GROUPS), *sends], 1: [metadata(ONLY_DEFAULT), *receives]},
                               traced_pp=2)
    _, result = run(text, tmp_path)
    assert result.summary["step_time_s"] == pytest.approx(3 * transfer_s(25e9, MIB), rel=EXACT)
    assert result.summary["warnings"] == [
        f"{tmp_path / 'rank1.json'}: nodes[1]: 3 sends or receives are taken in process group '3', not in '0', the "
        "only group the rank's process-group metadata lists: rank 0's send (nodes[1]) between the same ranks names "
        "it (first: recv 'recv 1')"]


def test_a_receive_that_names_no_group_between_ranks_that_use_two_is_refused(tmp_path):
    """Rank 0 sends 1 MiB in group 'a' and 1 MiB in group 'b' to rank 1, whose two receives name no group:
    each could be either communicator's, so the first is refused at its node, naming both groups."""
    text = two_host_chakra_job(tmp_path, {
        0: [p2p_node(1, "send", 1, MIB, group="a"), p2p_node(2, "send", 1, MIB, group="b")],
        1: [p2p_node(1, "recv", 0, MIB), p2p_node(2, "recv", 0, MIB)]})
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert (Path(caught.value.file).name, caught.value.field) == ("rank1.json", "nodes[0]")
    assert caught.value.problem == ("recv 'recv 1' names no process group, and the transfers from rank 0 to rank 1 "
                                    "are in 2 ('a', 'b'): which is its communicator is unknown")


def test_ends_whose_metadata_give_different_only_groups_are_refused_where_they_disagree(tmp_path):
    """Neither end of a 1 MiB transfer names its group; rank 0's metadata lists only '3', rank 1's only '0'.
    Which is their communicator is unknown: refused at rank 1's receive, naming both groups and both metadata
    nodes (it failed later, as rank 1 having '0 matching receives' in group '3')."""
    text = two_host_chakra_job(tmp_path, {0: [metadata(TWO_GROUPS[1:]), p2p_node(1, "send", 1, MIB)],
                                          1: [metadata(ONLY_DEFAULT), p2p_node(1, "recv", 0, MIB)]}, traced_pp=2)
    with pytest.raises(TraceError) as caught:
        run(text, tmp_path)
    assert (Path(caught.value.file).name, caught.value.field) == ("rank1.json", "nodes[1]")
    assert caught.value.problem == (
        "recv 'recv 1' names no process group and is taken in '0', the only group its rank's process-group metadata "
        f"lists (nodes[0].inputs.values), but rank 0's send 'send 1' ({tmp_path / 'rank0.json'}: nodes[1]) in '3', "
        f"the only group in {tmp_path / 'rank0.json'}: nodes[0].inputs.values; no end between the two ranks names "
        "its group: which is their communicator is unknown")


def collective_rank(folder: Path, rank: int, groups: list[dict] | None, launched: str | None) -> None:
    """Rank ``rank``'s Chakra trace: metadata of ``groups`` (none: no metadata node), then a 64 MiB all-reduce
    without pg_name, launched (``launched`` not None) by a record_param_comms node that records group
    (``launched``, its description) as PyTorch's RECORD_PARAM_COMMS_DATA does."""
    nodes = [metadata(groups)] if groups else []
    reduce = {"id": 3, "name": "all_reduce", "type": "COMM_COLL_NODE",
              "attr": [{"name": "comm_type", "int64Val": 0}, {"name": "comm_size", "int64Val": ALL_REDUCE_BYTES}]}
    if launched is not None:
        description = next(group["pg_desc"] for group in MESH if group["pg_name"] == launched)
        values = [[[7, 8, 0, ALL_REDUCE_BYTES // 2, 2, "cuda:0"]], [12, False], [launched, description], rank,
                  "allreduce", [], [], 0, 1, 2]
        nodes.append({"id": 2, "name": "record_param_comms", "type": "COMP_NODE",
                      "inputs": {"values": str(values)}, "attr": [{"name": "is_cpu_op", "boolVal": True}]})
        reduce = {**reduce, "ctrlDeps": [2]}
    (folder / f"rank{rank}.json").write_text(json.dumps([*nodes, reduce]))


@pytest.mark.parametrize(("groups", "launched", "group"), [(MESH, "1", "1"), (MESH, "0", "0"), ([MESH[1]], None, "1")],
                         ids=["launcher-tp", "launcher-default", "only-group"])
def test_a_chakra_collective_without_pg_name_takes_its_launcher_s_group_else_the_metadata_s_only_one(
        tmp_path, groups, launched, group):
    """An all-reduce node without pg_name is in the group its launching record_param_comms node records ('1', described
    mesh_tp; '0', default_pg), else in the only group its rank's metadata lists ('1'): 64 MiB per GPU of TP traffic
    (mesh_tp's two ranks are the whole job, which leaves the default group no data parallelism), matched in that
    group, not in a group named 'default'."""
    for rank in (0, 1):
        collective_rank(tmp_path, rank, groups, launched)
    _, result = run(chakra_scenario(tmp_path), tmp_path)
    assert result.summary["traffic_bytes_per_gpu"] == pytest.approx(
        {"tp": ALL_REDUCE_BYTES, "cp": 0.0, "pp": 0.0, "dp": 0.0, "ep": 0.0}, rel=EXACT)
    assert result.summary["trace"]["collective_matching"] == {group: "order"}


def test_a_chakra_collective_whose_group_the_traces_leave_open_is_refused(tmp_path):
    """The metadata lists two groups of ranks 0 and 1 and no launching node names either: the all-reduce's
    ranks are unknown, so it is refused at its node (it ran in a group named 'default')."""
    for rank in (0, 1):
        collective_rank(tmp_path, rank, MESH, None)
    with pytest.raises(TraceError) as caught:
        run(chakra_scenario(tmp_path), tmp_path)
    assert (Path(caught.value.file).name, caught.value.field) == ("rank0.json", "nodes[1]")
    assert caught.value.problem == ("collective 'all_reduce' names no process group, while the traces name 2 "
                                    "('0', '1'): which ranks run it is unknown")


def test_collectives_in_traces_that_name_no_group_run_in_one_group_of_their_ranks_with_a_warning(tmp_path):
    """No trace names a process group (no pg_name, launcher or metadata): the all-reduces are one group of the two ranks
    that run them (64 MiB per GPU of DP), and a warning says so."""
    for rank in (0, 1):
        collective_rank(tmp_path, rank, None, None)
    _, result = run(chakra_scenario(tmp_path), tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(ALL_REDUCE_BYTES, rel=EXACT)
    assert result.summary["warnings"] == [
        f"{tmp_path / 'rank0.json'}: nodes[0]: 2 collectives name no process group, and no trace names one: taken "
        "as one group of the ranks that run them (0, 1)"]


@pytest.mark.parametrize("descriptions", [("default_pg", "default_pg"), ("default_pg", "undefined")],
                         ids=["alike", "different"])
def test_a_kineto_collective_without_a_group_name_is_not_named_by_its_description(tmp_path, descriptions):
    """The bundled two-rank Kineto all-reduce without `Process Group Name`: its `Process Group Description` is not taken
    as the group's name (descriptions repeat across groups, so they name none; ranks describing it differently would
    be refused for a collective of group 'default_pg' missing on rank 1): described alike, the all-reduces are one
    group of the two ranks (its 32 MiB per GPU of DP, as with the name) with a warning; described differently,
    refused at rank 1's event, naming both descriptions."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    for rank, description in enumerate(descriptions):
        comms_args(traces, rank, **{"Process Group Name": None, "Process Group Description": description})
    text = two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces))
    if descriptions[0] != descriptions[1]:
        with pytest.raises(TraceError) as caught:
            run(text, tmp_path)
        assert (Path(caught.value.file).name, caught.value.field) == ("rank1.json", "traceEvents[8]")
        assert caught.value.problem == (
            "collective 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL' names no process group and describes it as "
            "'undefined', but 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL' "
            f"({traces / 'rank0.json'}: traceEvents[8]) as 'default_pg': which ranks run each is unknown")
        return
    _, result = run(text, tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(ALLREDUCE_BYTES, rel=EXACT)
    assert result.summary["warnings"] == [
        f"{traces / 'rank0.json'}: traceEvents[8]: 2 collectives name no process group, and no trace names one: "
        "taken as one group of the ranks that run them (0, 1)"]


def test_a_kineto_collective_without_a_group_name_takes_the_only_group_of_pg_config(tmp_path):
    """The bundled two-rank Kineto all-reduce without `Process Group Name`, each rank's `pg_config` listing one group,
    '0' of ranks 0 and 1: as a Chakra node without pg_name beside metadata of one group, the all-reduce is in that
    group (its 32 MiB per GPU of DP, matched in group '0'), without a warning, not refused for naming no group."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    for rank in (0, 1):
        comms_args(traces, rank, **{"Process Group Name": None, "Process Group Description": None,
                                    "Process Group Ranks": None})
        path = traces / f"rank{rank}.json"
        doc = json.loads(path.read_text())
        doc["distributedInfo"]["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2,
                                                "ranks": [0, 1]}]
        path.write_text(json.dumps(doc))
    _, result = run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == pytest.approx(ALLREDUCE_BYTES, rel=EXACT)
    assert result.summary["trace"]["collective_matching"] == {"0": "order"}
    assert result.summary["warnings"] == []


def test_kineto_collectives_whose_metadata_give_different_only_groups_are_refused_where_they_disagree(tmp_path):
    """The bundled two-rank Kineto all-reduce without `Process Group Name`, rank 0's `pg_config` listing only '0'
    of ranks 0 and 1, rank 1's only '5' of the same ranks: which is their communicator is unknown, refused at
    rank 1's all-reduce naming both groups and both metadata, as a transfer's ends are (it failed later, as
    rank 0's all-reduce in '0' without a counterpart on rank 1)."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    for rank, name in ((0, "0"), (1, "5")):
        comms_args(traces, rank, **{"Process Group Name": None, "Process Group Description": None,
                                    "Process Group Ranks": None})
        path = traces / f"rank{rank}.json"
        doc = json.loads(path.read_text())
        doc["distributedInfo"]["pg_config"] = [{"pg_name": name, "pg_desc": "undefined", "pg_size": 2,
                                                "ranks": [0, 1]}]
        path.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as caught:
        run(two_rank_scenario("100 Gb/s").replace(str(KINETO_2RANK), str(traces)), tmp_path)
    kernel = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    assert (Path(caught.value.file).name, caught.value.field) == ("rank1.json", "traceEvents[8]")
    assert caught.value.problem == (
        f"collective {kernel!r} names no process group and is taken in '5', the only group its rank's process-group "
        f"metadata lists (distributedInfo.pg_config), but rank 0's collective {kernel!r} "
        f"({traces / 'rank0.json'}: traceEvents[8]) in '0' of ranks [0, 1], the only group in "
        f"{traces / 'rank0.json'}: distributedInfo.pg_config, and rank 1 runs no collective of '0': which is their "
        "communicator is unknown")


def test_a_group_whose_members_no_trace_tells_is_taken_as_its_traced_ranks_with_a_warning(tmp_path):
    """Rank 0's trace alone of an 8-rank job (world_size 8), its all-reduce in group '0' with neither `Process Group
    Ranks` nor `Group size`: the group's members are the ranks whose traces use it, rank 0 alone, so the all-reduce
    sends nothing (a one-rank ring), and the run warns that the group was taken as 1 of the job's 8 ranks."""
    traces = copy_traces(KINETO_2RANK, tmp_path)
    comms_args(traces, 0, world=8, **{"Process Group Ranks": None, "Group size": None})
    text = two_rank_scenario("100 Gb/s", nodes=8).replace(f"{KINETO_2RANK}/rank*.json", f"{traces}/rank0.json")
    _, result = run(text, tmp_path)
    assert result.summary["traffic_bytes_per_gpu"]["dp"] == 0.0
    assert result.summary["warnings"] == [
        f"{traces / 'rank0.json'}: traceEvents[8]: process group '0': no trace lists its members or its size, so it "
        "is taken as the rank whose traces use it (0), 1 of the traced job's 8"]


def test_no_member_warning_where_every_rank_of_the_job_has_a_trace(tmp_path):
    """Four ranks, each traced, no metadata: a 1 MiB all-reduce in group 'tp0' (ranks 0, 1) or 'tp1' (2, 3),
    then one in 'dp' of all four, no trace listing members or sizes. The ranks that use a group are all its
    members, as no rank lacks a trace: 1 MiB (2-rank ring, 2(p-1)/p x n) + 1.5 MiB (4-rank) per GPU, and no
    warning (one per tp group was given, as if the groups could span untraced ranks)."""
    nodes = {rank: [collective_node(1, "tp0" if rank < 2 else "tp1"), collective_node(2, "dp", deps=(1,))]
             for rank in range(4)}
    for rank, rank_nodes in nodes.items():
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(rank_nodes))
    cluster = "{topology: ethernet-100g, nodes: 4, nic_bandwidth: 25 Gb/s}"
    _, result = run(chakra_scenario(tmp_path, cluster), tmp_path)
    assert sum(result.summary["traffic_bytes_per_gpu"].values()) == pytest.approx(2.5 * MIB, rel=EXACT)
    assert result.summary["warnings"] == []


def collective_node(node_id: int, group: str, deps: tuple[int, ...] = ()) -> dict:
    """A Chakra all-reduce of 1 MiB in process group ``group`` (pg_name), after the nodes ``deps``."""
    return {"id": node_id, "name": f"all_reduce {node_id}", "type": "COMM_COLL_NODE", "ctrlDeps": list(deps),
            "attr": [{"name": "comm_type", "int64Val": 0}, {"name": "comm_size", "int64Val": MIB},
                     {"name": "pg_name", "stringVal": group}]}
