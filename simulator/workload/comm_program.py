"""Communication-only workloads: a scenario's `workload:` list of collectives and transfers, turned into ops.

Each item becomes one CollectiveOp per member GPU on its stream; `after` makes an item wait for
the named items on the members they share, and `repeat` issues the item k times back to back.
"""

from __future__ import annotations

from simulator.config.loader import LoadedScenario
from simulator.config.schema import CollectiveItem
from simulator.program.ops import CollectiveOp


def resolve_group(item: CollectiveItem, index: int, num_gpus: int, loaded: LoadedScenario) -> tuple[int, ...]:
    """The GPU indices an item runs on, checked against the cluster."""
    path = ("workload", index)
    if item.op == "send_recv":
        members = (item.src, item.dst)
        for name, gpu in (("src", item.src), ("dst", item.dst)):
            if not 0 <= gpu < num_gpus:
                raise loaded.error(path + (name,), f"GPU {gpu} does not exist", f"0..{num_gpus - 1}")
        if item.src == item.dst:
            raise loaded.error(path + ("dst",), "send_recv needs two different GPUs", "dst != src")
        return members
    if item.group == "all":
        members = tuple(range(num_gpus))
    elif isinstance(item.group, str):
        bounds = item.group.split("-")
        if len(bounds) != 2 or not all(b.strip().isdigit() for b in bounds):
            raise loaded.error(path + ("group",), f"cannot read group {item.group!r}",
                               "all, a list of GPU indices, or a range like 0-7")
        low, high = int(bounds[0]), int(bounds[1])
        if high < low:
            raise loaded.error(path + ("group",), f"empty range {item.group!r}", "A-B with A <= B")
        members = tuple(range(low, high + 1))
    else:
        members = tuple(item.group)
    bad = [gpu for gpu in members if not 0 <= gpu < num_gpus]
    if bad:
        raise loaded.error(path + ("group",), f"GPUs {bad[:4]} do not exist", f"0..{num_gpus - 1}")
    if len(set(members)) != len(members):
        raise loaded.error(path + ("group",), "a GPU appears twice in the group", "distinct GPU indices")
    if len(members) < 2:
        raise loaded.error(path + ("group",), "a collective needs at least 2 GPUs", "2 or more GPU indices")
    if not 0 <= item.root < len(members):
        raise loaded.error(path + ("root",), f"root {item.root} is not a position in the group",
                           f"0..{len(members) - 1}")
    return members


def build_comm_program(loaded: LoadedScenario, num_gpus: int) -> list[CollectiveOp]:
    """Ops for every GPU from the scenario's workload list, in file order per GPU."""
    items = loaded.scenario.workload
    names = [item.name or f"{item.op}#{i}" for i, item in enumerate(items)]
    first_seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in first_seen:
            raise loaded.error(("workload", i, "name"), f"name {name!r} is used twice", "unique names")
        first_seen[name] = i
    last_op_of: dict[tuple[str, int], int] = {}
    ops: list[CollectiveOp] = []
    for index, item in enumerate(items):
        members = resolve_group(item, index, num_gpus, loaded)
        for name in item.after:
            if name not in first_seen or first_seen[name] >= index:
                raise loaded.error(("workload", index, "after"), f"{name!r} is not an earlier item",
                                   ", ".join(names[:index]) or "no earlier items")
        for repetition in range(item.repeat):
            key = names[index] if item.repeat == 1 else f"{names[index]}.{repetition}"
            for rank in members:
                deps = tuple(last_op_of[(name, rank)] for name in item.after if (name, rank) in last_op_of)
                op = CollectiveOp(id=len(ops), rank=rank, stream=item.stream, name=names[index], deps=deps,
                                  category="comm", op=item.op, group=members, nbytes=item.bytes, key=key,
                                  algorithm=item.algorithm or "auto", root=item.root)
                ops.append(op)
                last_op_of[(names[index], rank)] = op.id
    return ops
