"""Communication-only workloads: a scenario's `workload:` list of collectives and transfers, turned into ops.

Each item becomes one CollectiveOp per member GPU on its stream; `after` makes an item wait for
the named items on the members they share, and `repeat` issues the item k times back to back.
"""

from __future__ import annotations

from simulator.config.schema import CollectiveItem
from simulator.errors import ScenarioError
from simulator.program.ops import CollectiveOp


def resolve_group(item: CollectiveItem, index: int, num_gpus: int) -> tuple[int, ...]:
    """The GPU indices an item runs on, checked against the cluster."""
    path = f"workload[{index}]"
    if item.op == "send_recv":
        assert item.src is not None and item.dst is not None  # the schema requires both for send_recv
        members: tuple[int, ...] = (item.src, item.dst)
        for name, gpu in (("src", item.src), ("dst", item.dst)):
            if not 0 <= gpu < num_gpus:
                raise ScenarioError(f"GPU {gpu} does not exist", field=f"{path}.{name}",
                                    allowed=f"0..{num_gpus - 1}")
        if item.src == item.dst:
            raise ScenarioError("send_recv needs two different GPUs", field=f"{path}.dst",
                                allowed="dst != src")
        return members
    members = tuple(range(num_gpus)) if item.group == "all" else tuple(item.group)
    bad = [gpu for gpu in members if not 0 <= gpu < num_gpus]
    if bad:
        raise ScenarioError(f"GPUs {bad[:4]} do not exist", field=f"{path}.group",
                            allowed=f"0..{num_gpus - 1}")
    if len(set(members)) != len(members):
        raise ScenarioError("a GPU appears twice in the group", field=f"{path}.group",
                            allowed="distinct GPU indices")
    if len(members) < 2:
        raise ScenarioError("a collective needs at least 2 GPUs", field=f"{path}.group",
                            allowed="2 or more GPU indices")
    if not 0 <= item.root < len(members):
        raise ScenarioError(f"root {item.root} is not a position in the group", field=f"{path}.root",
                            allowed=f"0..{len(members) - 1}")
    return members


def item_names(items: list[CollectiveItem]) -> list[str]:
    """Each item's name, the one its ops carry: its own, else `op#index`."""
    return [item.name or f"{item.op}#{i}" for i, item in enumerate(items)]


def build_comm_program(items: list[CollectiveItem], num_gpus: int) -> list[CollectiveOp]:
    """Ops for every GPU from the scenario's workload list, in file order per GPU."""
    names = item_names(items)
    first_seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in first_seen:
            raise ScenarioError(f"name {name!r} is used twice", field=f"workload[{i}].name",
                                allowed="unique names")
        first_seen[name] = i
    last_op_of: dict[tuple[str, int], int] = {}
    ops: list[CollectiveOp] = []
    for index, item in enumerate(items):
        members = resolve_group(item, index, num_gpus)
        for name in item.after:
            if name not in first_seen or first_seen[name] >= index:
                raise ScenarioError(f"{name!r} is not an earlier item", field=f"workload[{index}].after",
                                    allowed=", ".join(names[:index]) or "no earlier items")
        for repetition in range(item.repeat):
            key = names[index] if item.repeat == 1 else f"{names[index]}.{repetition}"
            for rank in members:
                deps = tuple(last_op_of[(name, rank)] for name in item.after if (name, rank) in last_op_of)
                op = CollectiveOp(id=len(ops), rank=rank, stream=item.stream, name=names[index], deps=deps,
                                  category="comm", op=item.op, group=members, nbytes=item.bytes, key=key,
                                  algorithm=item.algorithm or "auto", protocol=item.protocol or "auto",
                                  root=item.root)
                ops.append(op)
                last_op_of[(names[index], rank)] = op.id
    return ops
