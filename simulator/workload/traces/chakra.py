"""Chakra execution traces in JSON form, one file per rank: COMP, COMM_COLL, COMM_SEND and COMM_RECV nodes
with their durations, collective type and size, data and control dependencies and process-group names.

Accepted layouts: the output of Chakra's jsonizer (the GlobalMetadata object followed by one object per node,
protobuf JSON with camelCase keys and 64-bit integers as strings), a JSON array of nodes, or an object with a
`nodes` array; snake_case keys are read as well. Nodes of other types (metadata, memory) cost nothing and pass
their dependencies on; a `## process_group:init ##` metadata node (PyTorch's execution traces) tells each
process group's members and description. A Chakra graph has no streams: compute nodes run in dependency
order on `compute`, CPU nodes (`is_cpu_op`) on `cpu`, collectives on `comm`, sends and receives each as soon
as their dependencies are done.
"""

from __future__ import annotations

import ast
import heapq
import json
from dataclasses import replace
from pathlib import Path

from simulator.collectives.names import Primitive
from simulator.units import counted
from simulator.workload.traces.model import (
    ATTENTION_KEYS,
    CPU_STREAM,
    ProcessGroup,
    TracedOp,
    TracedRank,
    as_int,
    attention_key_length,
    checked_duration,
    checked_message,
    kernel_kind,
    trace_error,
)

NODE_TYPES = {0: "INVALID_NODE", 1: "METADATA_NODE", 2: "MEM_LOAD_NODE", 3: "MEM_STORE_NODE", 4: "COMP_NODE",
              5: "COMM_SEND_NODE", 6: "COMM_RECV_NODE", 7: "COMM_COLL_NODE"}
COLLECTIVE_TYPES: dict[int, Primitive] = {0: "all_reduce", 1: "reduce", 2: "all_gather", 5: "broadcast",
                                          6: "all_to_all", 7: "reduce_scatter", 8: "reduce_scatter", 9: "all_reduce"}
"""Chakra CollectiveCommType -> trainsim primitive (BARRIER as an all-reduce of its size; GATHER and SCATTER
have no trainsim plan)."""
COLLECTIVE_NAMES = {"ALL_REDUCE": 0, "REDUCE": 1, "ALL_GATHER": 2, "GATHER": 3, "SCATTER": 4, "BROADCAST": 5,
                    "ALL_TO_ALL": 6, "REDUCE_SCATTER": 7, "REDUCE_SCATTER_BLOCK": 8, "BARRIER": 9}
P2P_STREAM = "p2p"
LAUNCHER = "record_param_comms"
"""PyTorch's CPU op around every collective and point-to-point call, whose inputs record the call's arguments."""
PEER_ALLOWED = ("the peer rank as an attribute (comm_dst / comm_src), or the send's (receive's) launching "
                "record_param_comms node with its process group's members in the process-group metadata, or a "
                "process group of two ranks (pg_name, else the group the launching record_param_comms node "
                "names, else the process-group metadata's only group)")
US = 1e-6
GROUP_SIZE = "pg_size"
"""The attribute of a collective's process-group size (PyTorch's execution-trace observer's name for it)."""
PG_INIT = "process_group:init"
DEFAULT_GROUP = "default_pg"
"""torch.distributed's description of the default process group, the one of every rank of the job: where its
ranks are 0 to n-1, the job has n ranks."""


def read_chakra(path: Path) -> TracedRank:
    """One rank's Chakra JSON trace as a TracedRank."""
    file = str(path)
    nodes = _nodes(file, _documents(path))
    by_id: dict[int, int] = {}
    for position, node in enumerate(nodes):
        node_id = _int(file, position, node, "id")
        if node_id in by_id:
            raise trace_error(file, f"nodes[{position}]", f"node id {node_id} appears twice", "unique node ids")
        by_id[node_id] = position
    order = _topological(file, nodes, by_id)
    groups, stated_at, unnamed = _process_groups(file, nodes)
    only = next(iter(groups)) if len(groups) == 1 and not unnamed else ""
    ops: list[TracedOp] = []
    op_of: dict[int, tuple[int, ...]] = {}
    for position in order:
        node = nodes[position]
        deps = tuple(sorted({dep for parent in _parents(file, position, node, by_id) for dep in op_of[parent]}))
        op = _op(file, position, node, deps, groups, only, _launcher(nodes, by_id, node))
        if op is None:
            op_of[position] = deps
            continue
        if op.kind == "compute" and not op.host and kernel_kind(op.name) == "attention":
            op = replace(op, key_length=_key_length(nodes, by_id, node))
        op_of[position] = (len(ops),)
        ops.append(op)
    if not ops:
        raise trace_error(file, "nodes", f"nothing to replay in {counted(len(nodes), 'node')}: no COMP_NODE, "
                          "COMM_COLL_NODE, COMM_SEND_NODE or COMM_RECV_NODE", "an execution trace of one training step")
    everyone = next((name for name, group in groups.items()
                     if group.description == DEFAULT_GROUP and group.members == tuple(range(len(group.members)))), None)
    return TracedRank(file=file, rank=-1, ops=tuple(ops), timed=False, events=len(nodes), events_field="nodes",
                      world=len(groups[everyone].members) if everyone is not None else 0,
                      world_field=_metadata_field(stated_at[everyone] if everyone is not None else None), groups=groups,
                      groups_field=_metadata_field(max(stated_at.values(), default=None)))


def _documents(path: Path) -> list:
    """Every JSON value in the file: one document, or several written one after another (the jsonizer)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise trace_error(str(path), "", f"cannot read the file ({exc})") from None
    decoder = json.JSONDecoder()
    documents, position = [], 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            break
        try:
            document, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            raise trace_error(str(path), "", f"not valid JSON ({exc.msg} at line {exc.lineno}); a truncated file?",
                              "Chakra JSON: the jsonizer's output, a list of nodes or {nodes: [...]}") from None
        documents.append(document)
    return documents


def _nodes(file: str, documents: list) -> list[dict]:
    if len(documents) == 1 and isinstance(documents[0], dict) and "traceEvents" in documents[0]:
        raise trace_error(file, "traceEvents", "a PyTorch profiler (Kineto) trace, not a Chakra execution trace",
                          "workload.format: kineto for this file")
    if len(documents) == 1 and isinstance(documents[0], dict) and isinstance(documents[0].get("nodes"), list):
        nodes = documents[0]["nodes"]
    elif len(documents) == 1 and isinstance(documents[0], list):
        nodes = documents[0]
    else:
        nodes = [doc for doc in documents if not (isinstance(doc, dict) and "id" not in doc and "version" in doc)]
    for position, node in enumerate(nodes):
        if not isinstance(node, dict):
            raise trace_error(file, f"nodes[{position}]", "a node is not an object")
    if not nodes:
        raise trace_error(file, "nodes", "the trace has no nodes", "Chakra nodes with id, name, type")
    return nodes


def _get(node: dict, snake: str) -> object:
    """A field by its proto name or its protobuf-JSON camelCase name."""
    return node.get(_spelled(node, snake))


def _spelled(node: dict, snake: str) -> str:
    """A field's name as ``node`` spells it: the proto name, or the camelCase one that protobuf JSON (the
    jsonizer's output) writes, so that an error names `dataDeps` where the file has `dataDeps`."""
    if snake in node:
        return snake
    head, *rest = snake.split("_")
    camel = head + "".join(part.title() for part in rest)
    return camel if camel in node else snake


def _int(file: str, position: int, node: dict, name: str, default: int | None = None) -> int:
    value = _get(node, name)
    if value is None and default is not None:
        return default
    try:
        number = as_int(value)
    except (TypeError, ValueError):
        problem = "missing" if value is None else f"{value!r} is not an integer"
        raise trace_error(file, f"nodes[{position}].{_spelled(node, name)}",
                          problem if name == "id" else _of_node(node, problem), "a whole number") from None
    if number < 0:
        raise trace_error(file, f"nodes[{position}].{_spelled(node, name)}", _of_node(node, f"{number} is negative"),
                          "a value >= 0")
    return number


def _of_node(node: dict, problem: str) -> str:
    """``problem`` led by the node's id where it has one: `nodes[i]` counts the nodes from 0, without the
    jsonizer's metadata header, which a reader of the file may count, while the id is what the file spells."""
    node_id = node.get("id")
    return f"node id {node_id}: {problem}" if isinstance(node_id, (str, int)) and not isinstance(node_id, bool) \
        else problem


def _attrs(node: dict) -> dict[str, object]:
    """A node's attributes by name, each with the value of whichever *_val field it sets."""
    result = {}
    for attr in node.get("attr") or []:
        if isinstance(attr, dict) and "name" in attr:
            values = [value for key, value in attr.items() if key.endswith(("_val", "Val", "_list", "List"))]
            result[str(attr["name"])] = values[0] if values else None
    return result


def _parents(file: str, position: int, node: dict, by_id: dict[int, int]) -> list[int]:
    parents = []
    for name in ("data_deps", "ctrl_deps"):
        deps = _get(node, name) or []
        field = f"nodes[{position}].{_spelled(node, name)}"
        if not isinstance(deps, list):
            raise trace_error(file, field, _of_node(node, f"{deps!r} is not a list of node ids"))
        for dep in deps:
            try:
                parents.append(by_id[as_int(dep)])
            except (KeyError, TypeError, ValueError):
                raise trace_error(file, field, _of_node(node, f"dependency {dep!r} is not a node of the trace"),
                                  "ids of nodes in the same file") from None
    return parents


def _topological(file: str, nodes: list[dict], by_id: dict[int, int]) -> list[int]:
    """Node positions in dependency order, ties in file order; a cycle is an error."""
    children: dict[int, list[int]] = {}
    waiting = [0] * len(nodes)
    for position, node in enumerate(nodes):
        for parent in set(_parents(file, position, node, by_id)):
            children.setdefault(parent, []).append(position)
            waiting[position] += 1
    ready = [position for position in range(len(nodes)) if waiting[position] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        position = heapq.heappop(ready)
        order.append(position)
        for child in children.get(position, []):
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, child)
    if len(order) < len(nodes):
        stuck = next(position for position in range(len(nodes)) if waiting[position])
        raise trace_error(file, f"nodes[{stuck}]", "the dependencies form a cycle", "an acyclic graph")
    return order


def _process_groups(file: str, nodes: list[dict]) -> tuple[dict[str, ProcessGroup], dict[str, int], int]:
    """The process groups that a `## process_group:init ##` node describes, by name, the position of the node
    that stated each (the last, where several do), and how many entries name no group (older PyTorch's pg_ids,
    which no node refers to: such a metadata's groups are not all known by name).
    PyTorch's execution-trace observer records torch.distributed's group configuration there (`pg_name`,
    `pg_desc`, `ranks`, `group_size`; `ranks` empty for a group of every rank) and Chakra's converter keeps the
    node as metadata, the JSON inside the text of its `inputs.values`; without such a node, nothing is known of
    the groups but their names."""
    groups: dict[str, ProcessGroup] = {}
    stated_at: dict[str, int] = {}
    unnamed = 0
    for position, node in enumerate(nodes):
        if PG_INIT not in str(node.get("name", "")):
            continue
        where = _metadata_field(position)
        inputs = node.get("inputs")
        entries = _group_entries(inputs.get("values") if isinstance(inputs, dict) else None)
        if entries is None:
            raise trace_error(file, where, "the process-group metadata holds no list of process groups",
                              "the JSON of torch.distributed's pg_config_info: [{pg_name, pg_desc, ranks, "
                              "group_size}, ...]")
        for entry in entries:
            name, desc = entry.get("pg_name"), entry.get("pg_desc")
            if name is None:
                unnamed += 1
                continue
            ranks, size = entry.get("ranks") or [], entry.get("group_size", 0)
            if isinstance(ranks, dict):  # {global rank: rank in the group}, as some versions write it
                ranks = list(ranks)
            try:
                members = tuple(as_int(rank) for rank in ranks)
                size = as_int(size) if size else len(members)
            except (TypeError, ValueError):
                raise trace_error(file, where, f"process group {name!r} has ranks {ranks!r} and size {size!r}",
                                  "whole numbers") from None
            distinct = len(set(members)) == len(members)
            if min(members, default=size) < 0 or not distinct or (members and size != len(members)):
                raise trace_error(file, where, f"process group {name!r} lists ranks {list(members)} with group_size "
                                  f"{size}", "distinct ranks >= 0, as many as the group_size")
            groups[str(name)] = ProcessGroup(str(desc or name), members or tuple(range(size)))
            stated_at[str(name)] = position
    return groups, stated_at, unnamed


def _metadata_field(position: int | None) -> str:
    """The field of the process-group metadata of the node at ``position`` ('' for None: no node)."""
    return f"nodes[{position}].inputs.values" if position is not None else ""


def _group_entries(values: object) -> list[dict] | None:
    """The list of group objects in a process-group metadata node's `inputs.values`: the Python text of a list
    holding the JSON (Chakra's converter), the JSON itself, or a list holding its text."""
    if isinstance(values, list) and all(isinstance(entry, dict) for entry in values):
        return values
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
        return _group_entries(values[0])
    if not isinstance(values, str) or "[{" not in values:
        return None
    try:
        entries, _ = json.JSONDecoder().raw_decode(values, values.index("[{"))
    except json.JSONDecodeError:
        return None
    return entries if all(isinstance(entry, dict) for entry in entries) else None


def _launcher(nodes: list[dict], by_id: dict[int, int], node: dict) -> dict | None:
    """The `record_param_comms` node that launched ``node``, where the trace keeps it: Chakra's converter gives a
    GPU node its launching CPU op as a control dependency, and keeps that op as a node of its own."""
    for position in _control_parents(by_id, node):
        if nodes[position].get("name") == LAUNCHER:
            return nodes[position]
    return None


def _control_parents(by_id: dict[int, int], node: dict) -> list[int]:
    """The positions of ``node``'s control dependencies, in their order, skipping any that is not a known node's
    id (a JSON number or its text); none where `ctrl_deps` is not a list."""
    deps = _get(node, "ctrl_deps")
    positions = []
    for dep in deps if isinstance(deps, list) else []:
        try:
            positions.append(by_id[as_int(dep)])
        except (KeyError, TypeError, ValueError):
            continue
    return positions


def _key_length(nodes: list[dict], by_id: dict[int, int], node: dict) -> int:
    """The key length of an attention kernel's node: that of the innermost PyTorch attention op (model.py
    `ATTENTION_KEYS`) among the CPU ops that launched it, read off the op's recorded operand shapes; 0 where none
    records it. Chakra's converter gives each node the op that called it as a control dependency (a kernel its
    launching op, that op its caller) and keeps the op's `inputs.shapes`, the Python text of its operands' shapes
    (`record_shapes`)."""
    seen: set[int] = set()
    while True:
        parents = [position for position in _control_parents(by_id, node) if position not in seen]
        if not parents:
            return 0
        seen.add(parents[0])
        node = nodes[parents[0]]
        name = str(node.get("name", ""))
        if name in ATTENTION_KEYS:
            inputs = node.get("inputs")
            length = attention_key_length(name, _shapes(inputs.get("shapes") if isinstance(inputs, dict) else None))
            if length:
                return length


def _shapes(value: object) -> object:
    """An op's recorded operand shapes: the Python text of a list (Chakra's converter writes `str()` of the
    execution trace's list), or the list itself; None where unreadable."""
    if not isinstance(value, str):
        return value
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _node_type(file: str, where: str, value: object) -> str:
    """A node's type by name or number; an unknown or missing one is refused, not skipped, since a mistyped
    COMP_NODE would silently drop its time from the step."""
    kind = NODE_TYPES.get(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if kind not in NODE_TYPES.values():
        problem = "no node type" if value is None else f"unknown node type {value!r}"
        raise trace_error(file, f"{where}.type", problem,
                          ", ".join(f"{name} ({number})" for number, name in NODE_TYPES.items()))
    return str(kind)


def _op(file: str, position: int, node: dict, deps: tuple[int, ...], groups: dict[str, ProcessGroup], only: str,
        launcher: dict | None) -> TracedOp | None:
    """A node as a traced op, or None for nodes that cost nothing (metadata, memory); ``only`` is the one group
    the process-group metadata lists ('' where it lists none or several), ``launcher`` the `record_param_comms`
    node that launched it, if the trace keeps one."""
    where = f"nodes[{position}]"
    kind = _node_type(file, where, _get(node, "type"))
    name = str(node.get("name", ""))
    start = _int(file, position, node, "start_time_micros", 0) * US
    duration = checked_duration(_int(file, position, node, "duration_micros", 0) * US, file, where, name)
    attrs = _attrs(node)
    if kind == "COMP_NODE":
        host = attrs.get("is_cpu_op") in (True, "true", 1)
        return TracedOp(position, name, CPU_STREAM if host else "compute", "compute", start, duration, deps=deps,
                        host=host)
    if kind not in ("COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"):
        return None
    size = attrs.get("comm_size")
    try:
        nbytes = float(as_int(size))
    except ValueError:
        problem = (f"{kind} {name!r} has no comm_size" if size is None
                   else f"comm_size {size!r} of {name!r} is not a whole number of bytes")
        raise trace_error(file, where, problem, "a comm_size attribute in bytes") from None
    if nbytes < 0:
        raise trace_error(file, where, f"comm_size {nbytes} is negative", "bytes >= 0")
    checked_message(nbytes, file, where, name)
    group = str(attrs.get("pg_name") or "")
    if kind == "COMM_COLL_NODE":
        comm_type = attrs.get("comm_type")
        code = COLLECTIVE_NAMES.get(comm_type, comm_type) if isinstance(comm_type, str) else comm_type
        try:
            primitive = COLLECTIVE_TYPES[as_int(code)]
        except (KeyError, TypeError, ValueError):
            raise trace_error(file, where, f"collective type {comm_type!r} of {name!r} is not supported",
                              ", ".join(f"{key} ({code})" for key, code in COLLECTIVE_NAMES.items()
                                        if code in COLLECTIVE_TYPES)) from None
        group, description, inferred = _group(group, groups, only, launcher, None)
        members = groups[group].members if group in groups else ()
        size, stated = _recorded_size(file, where, attrs, launcher)
        if members and size and size != len(members):
            raise trace_error(file, where, f"{name!r} records a process group of {counted(size, 'rank')} ({stated}), "
                              f"but the process-group metadata lists {counted(len(members), 'rank')} {list(members)} "
                              f"for {group!r}",
                              "a group size equal to the number of the group's ranks in the metadata")
        return TracedOp(position, name, "comm", "collective", start, duration, op=primitive, nbytes=nbytes,
                        group=group, members=members, group_size=len(members) or size, size_field=stated,
                        description=description, group_inferred=inferred, deps=deps,
                        input_bytes=primitive == "all_gather")
    send = kind == "COMM_SEND_NODE"
    call = "send" if send else "recv"
    group, description, inferred = _group(group, groups, only, launcher, call)
    field = "comm_dst" if send else "comm_src"
    peer = attrs.get(field)
    members = ()
    if peer is None:
        peer_rank, members = _untold_peer(file, where, f"{kind} {name!r} has no {field}", group, groups,
                                          launcher, call)
    else:
        try:
            peer_rank = as_int(peer)
        except (TypeError, ValueError):
            peer_rank = -1
        if peer_rank < 0:
            raise trace_error(file, where, f"{field} {peer!r} of {name!r} is not a rank", PEER_ALLOWED)
    return TracedOp(position, name, P2P_STREAM, "send" if send else "recv", start, duration, op="send_recv",
                    nbytes=nbytes, group=group, description=description, group_inferred=inferred,
                    peer=peer_rank, members=members, deps=deps)


def _group(pg_name: str, groups: dict[str, ProcessGroup], only: str, launcher: dict | None,
           call: str | None) -> tuple[str, str, bool]:
    """The process group of a collective (``call`` None) or a send (recv), its description, and whether the group
    is inferred rather than named by the node's own record. The group: its ``pg_name``; else the group that its
    launching `record_param_comms` node records (PyTorch records every call's group among its arguments); else
    ``only``, the only group of the process-group metadata (torch.distributed's configuration lists every group
    the rank is a member of, so a rank of one group communicates in it), inferred; else '', unknown (several
    groups, or no metadata: groups.py settles it from the other traces or refuses). Its description: the
    metadata's; where the metadata lacks the group, the one the launching node records with that group's name
    (the same call's record: no doubt which group it describes); else the name. A description is never taken to
    name a group: descriptions are not unique (torchtitan's mesh gives each pipeline group
    `mesh_pp`, PyTorch every group made without one `undefined`), and a group that the metadata lacks by name is
    none of those it lists by any description."""
    launched, launched_description = _launched_group(launcher, call)
    name = pg_name or launched or only
    inferred = not (pg_name or launched) and bool(only)
    if name in groups:
        return name, groups[name].description, inferred
    return name, launched_description if name == launched and launched_description else name, inferred


def _untold_peer(file: str, where: str, missing: str, group: str, groups: dict[str, ProcessGroup],
                 launcher: dict | None, collective: str) -> tuple[int, tuple[int, ...]]:
    """The peer of a send or receive without comm_dst / comm_src (Chakra's converter from PyTorch execution
    traces writes neither): (its global rank, ()) where the launching `record_param_comms` node names its rank in
    the process group, the group's member at that place (torch.distributed lists a group's ranks in the order of
    their ranks in the group); else (-1, the members) where the group has two ranks, its peer then the member
    other than the file's rank, which the file order gives later (model.with_group_peers); else refused,
    ``missing`` saying what the node lacks."""
    known = groups.get(group)
    members = known.members if known is not None else ()
    place = _launched_peer(launcher, collective)
    if place is not None and members:
        if place >= len(members):
            raise trace_error(file, where, f"{missing}, and its record_param_comms node (id {_launcher_id(launcher)}) "
                              f"names rank {place} of process group {group!r}, which has "
                              f"{counted(len(members), 'rank')}",
                              PEER_ALLOWED)
        return members[place], ()
    if len(set(members)) == 2:
        return -1, members
    if not group:
        named = (f"its record_param_comms node (id {_launcher_id(launcher)}) names none" if launcher is not None
                 else "no record_param_comms node that launched it names one")
        listed = (f"the process-group metadata lists {counted(len(groups), 'group')}" if groups
                  else "no process-group metadata")
        why = f"and no process group: no pg_name, {named}, and {listed}"
    elif not members:
        why = f"and the trace lists no members of its process group {group!r} (no process-group metadata for it)"
    elif launcher is not None:
        why = (f"and its record_param_comms node (id {_launcher_id(launcher)}) names no rank before {collective!r} "
               f"in its inputs, so which of the {len(members)} ranks {list(members)} of process group {group!r} is "
               f"the peer is unknown")
    else:
        why = (f"and its process group {group!r} has {len(members)} ranks {list(members)}, so which is the peer "
               f"is unknown without the record_param_comms node that launched it")
    raise trace_error(file, where, f"{missing}, {why}", PEER_ALLOWED)


def _recorded_size(file: str, where: str, attrs: dict[str, object], launcher: dict | None) -> tuple[int, str]:
    """The size of a collective's process group as the trace records it, and where it says so: the node's
    `pg_size` attribute (the name PyTorch's execution-trace observer gives it), else the group size that its
    launching `record_param_comms` node records (`_launched_size`); (0, '') where neither does."""
    value = attrs.get(GROUP_SIZE)
    if value is not None:
        try:
            size = as_int(value)
        except (TypeError, ValueError):
            size = 0
        if size < 1:
            raise trace_error(file, where, f"{GROUP_SIZE} {value!r} is not a number of ranks", "a whole number >= 1")
        return size, GROUP_SIZE
    size = _launched_size(launcher)
    return (size, f"the size its record_param_comms node (id {_launcher_id(launcher)}) records") if size else (0, "")


def _launched_size(launcher: dict | None) -> int:
    """The size of the process group that the `record_param_comms` node that launched a collective records: the
    last of the arguments after the collective's name (RECORD_PARAM_COMMS_DATA: split sizes in and out, the
    group's first global rank and stride, its size, ProcessGroupNCCL's getSize(), whatever the job's); 0 where
    there is no such node, or its inputs do not read so (older PyTorch records the split sizes only)."""
    after = _launch_call(launcher, None)[1]
    size = after[4] if len(after) == 5 else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0


def _launcher_id(launcher: dict | None) -> object:
    """The id of a `record_param_comms` node, as the file writes it."""
    return (launcher or {}).get("id")


def _launched_peer(launcher: dict | None, collective: str) -> int | None:
    """The peer's rank in its process group as the `record_param_comms` node that launched a send (recv) records
    it: ProcessGroupNCCL::send (recv) passes the destination (source) rank in the group as the rank of the call's
    arguments (`_launch_call`). None where there is no such node, or its inputs do not read so."""
    arguments = _launch_call(launcher, collective)[0]
    rank = arguments[-1] if arguments else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None


def _launched_group(launcher: dict | None, call: str | None) -> tuple[str, str]:
    """The (name, description) of the process group that the `record_param_comms` node that launched a
    collective (``call`` None) or a send (recv) records: PyTorch passes them right before the rank
    (`_launch_call`). '' each where there is no such node, or its inputs do not read so."""
    arguments = _launch_call(launcher, call)[0]
    group = arguments[-2] if len(arguments) >= 2 else None
    fields = list(group) if isinstance(group, (list, tuple)) else []
    name, description = (fields + [None, None])[:2]
    return (name if isinstance(name, str) else "",
            description if isinstance(name, str) and isinstance(description, str) else "")


def _launch_call(launcher: dict | None, call: str | None) -> tuple[list, list]:
    """The arguments a `record_param_comms` node records before the name of its call, ``call`` (any collective's
    where None: the first text among them), and those after it: PyTorch's RECORD_PARAM_COMMS_DATA takes (input
    tensors, seq, (group name, description), rank, collective name, split sizes in and out, the group's first
    global rank, stride and size), which Chakra's converter keeps as the Python text of their list; ([], [])
    where there is no such node, or its inputs do not read so."""
    inputs = launcher.get("inputs") if launcher is not None else None
    values = inputs.get("values") if isinstance(inputs, dict) else None
    try:
        parsed = ast.literal_eval(values) if isinstance(values, str) else values
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return [], []
    if not isinstance(parsed, list):
        return [], []
    named = next((position for position in range(1, len(parsed)) if isinstance(parsed[position], str)), None)
    if named is None or (call is not None and parsed[named] != call):
        return [], []
    return parsed[:named], parsed[named + 1:]
