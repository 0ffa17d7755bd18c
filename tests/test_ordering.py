"""Happens-before between collective instances (engine/ordering.py) and the per-instance replay it allows:
an instance that no concurrent traffic meets is timed alone, which must not change the step."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from shared import SCENARIOS

from simulator.engine import sharing
from simulator.engine.ordering import Ordering
from simulator.engine.sharing import LinkSet
from simulator.program.ops import CollectiveOp, ComputeOp

ASYNC = frozenset({"pp"})


def _program():
    """Rank 0: A, then all-reduce X (with rank 1), then B; rank 1: X then C; a P2P send S from rank 0 after A
    (asynchronous) that C waits for; an all-gather Y on rank 1's side stream, after nothing."""
    return [
        ComputeOp(id=0, rank=0, stream="compute", name="A", duration=1.0),
        CollectiveOp(id=1, rank=0, stream="compute", name="X", op="all_reduce", group=(0, 1), nbytes=1.0, key="X"),
        ComputeOp(id=2, rank=0, stream="compute", name="B", duration=1.0),
        CollectiveOp(id=3, rank=1, stream="compute", name="X", op="all_reduce", group=(0, 1), nbytes=1.0, key="X"),
        CollectiveOp(id=4, rank=0, stream="pp", name="S", op="send_recv", group=(0, 1), nbytes=1.0, key="S",
                     deps=(0,)),
        CollectiveOp(id=5, rank=1, stream="pp", name="S", op="send_recv", group=(0, 1), nbytes=1.0, key="S"),
        ComputeOp(id=6, rank=1, stream="compute", name="C", duration=1.0, deps=(5,)),
        CollectiveOp(id=7, rank=1, stream="dp", name="Y", op="all_gather", group=(1, 2), nbytes=1.0, key="Y"),
    ]


def test_happens_before_follows_streams_dependencies_joins_and_asynchronous_sends():
    ordering = Ordering.of(_program(), ASYNC)
    x, s, y = (ordering.node_of_key[key] for key in ("X", "S", "Y"))
    c = ordering.node_of_op[6]
    assert ordering.before(x, c) and not ordering.before(c, x)  # X on rank 1's compute stream precedes C
    assert ordering.before(s, c)  # C waits for the asynchronous send
    assert ordering.concurrent(x, s)  # the send may run while X does
    assert ordering.concurrent(y, x) and ordering.concurrent(y, s)
    assert not ordering.concurrent(x, x)


@pytest.mark.parametrize(("ops_before", "entries"), [(10, np.int16), (40_000, np.int32)])
def test_the_clock_table_takes_16_bit_entries_where_every_stream_is_short_enough(ops_before, entries):
    """Rank 0 runs ``ops_before`` kernels before the program's A: 16-bit clock entries (half the bytes, which the
    budget counts) while each stream's positions fit in them, 32-bit past 32,767; the same answers either way."""
    from simulator.engine import ordering as module

    ahead = [ComputeOp(id=100 + index, rank=0, stream="compute", name="K", duration=1.0) for index in range(ops_before)]
    ops = [*ahead, *_program()]
    ordering = Ordering.of(ops, ASYNC)
    x, s, y = (ordering.node_of_key[key] for key in ("X", "S", "Y"))
    assert ordering.clocks.dtype == entries
    assert ordering.before(ordering.node_of_op[100], x) and ordering.before(s, ordering.node_of_op[6])
    assert ordering.concurrent(y, x)
    components, columns, nodes = module._components(ops, ASYNC)
    size = module.OrderingSize(len(ops), nodes, columns, longest=module.longest_component(components))
    assert size.bytes - len(ops) * module.BYTES_PER_OP == nodes * columns * np.dtype(entries).itemsize


def _send_chain(sends):
    """Rank 0: A, then ``sends`` asynchronous sends, each after the one before (the first after A), then B
    after the last."""
    chain = [CollectiveOp(id=1 + index, rank=0, stream="pp", name=f"S{index}", op="send_recv", group=(0, 1),
                          nbytes=1.0, key=f"S{index}", deps=(index,)) for index in range(sends)]
    return [ComputeOp(id=0, rank=0, stream="compute", name="A", duration=1.0), *chain,
            ComputeOp(id=sends + 1, rank=0, stream="compute", name="B", duration=1.0, deps=(sends,))]


def test_an_asynchronous_send_chain_passes_its_pairs_and_its_size_counts_them(monkeypatch):
    """Six chained sends pass 5 + 4 + ... + 0 = 15 pairs on the way to B, the op after them: each send happens
    before the later ones. The size counts them once the graph is known, before they are built: a budget that
    admits the program without them skips its ordering, and says the size with them."""
    from simulator.engine import ordering as module

    ops = _send_chain(6)
    ordering = module.ProgramOrder(ops, ASYNC).ordering
    sends = [ordering.node_of_key[f"S{index}"] for index in range(6)]
    assert len(ordering._passed_pairs) == 15
    assert ordering.before(sends[0], sends[5]) and ordering.before(sends[3], sends[4])
    assert not ordering.before(sends[5], sends[0])
    components, columns, nodes = module._components(ops, ASYNC)
    bare = module.OrderingSize(len(ops), nodes, columns, longest=module.longest_component(components))
    monkeypatch.setattr(module, "ORDERING_BUDGET_BYTES", bare.bytes)
    order = module.ProgramOrder(ops, ASYNC)
    assert order.ordering is None
    assert order.skipped_when_asked == module.SkippedOrdering(module.OrderingSize(8, 8, 1, 15, longest=2))


@pytest.mark.parametrize("missing", [8, 99, -1])
def test_a_dependency_on_an_op_outside_the_program_is_an_error(missing):
    """Ids past, beyond and before the program's: none maps to another op's node."""
    ops = [*_program(), ComputeOp(id=9, rank=0, stream="compute", name="D", duration=1.0, deps=(2, missing))]
    with pytest.raises(ValueError, match=f"not in the program: \\[{missing}\\]"):
        Ordering.of(ops, ASYNC)


@pytest.mark.parametrize("overrides", [(), ("model.moe.routing.balance=zipf",)])
def test_replaying_lone_instances_leaves_the_moe_step_unchanged(run_yaml, monkeypatch, overrides):
    """A folded MoE step with TP 2, EP 4 and two micro-batches: the per-instance replay (most all-to-alls run
    alone) gives the step of the live run to the last bit of rounding."""
    scenario = """
cluster: {topology: dgx-h100-cluster, nodes: 4}
model: {preset: mixtral-8x7b, layers: 4, moe: {experts: 8, top_k: 2}}
training: {seq_len: 2048, microbatches: 4, precision: bf16}
parallelism: {tp: 2, pp: 2, ep: 4, zero: 1}
"""
    replayed = run_yaml(scenario, *overrides)
    live_private = []

    def none_private(ops, links_of, async_streams, mirrors, mirror_links=None, shapes=None, order=None,
                     timed_apart=None):
        live_private.append(True)
        return frozenset()

    monkeypatch.setattr("simulator.simulation.private_collectives", none_private)
    live = run_yaml(scenario, *overrides)
    assert live_private
    assert replayed.summary["flows_simulated"] < live.summary["flows_simulated"]
    assert replayed.summary["step_time_s"] == pytest.approx(live.summary["step_time_s"], rel=1e-12)
    assert replayed.summary["traffic_bytes_per_gpu"] == pytest.approx(live.summary["traffic_bytes_per_gpu"],
                                                                      rel=1e-12)


def test_an_instance_whose_mirrors_share_its_links_is_never_replayed():
    ops = [CollectiveOp(id=0, rank=0, stream="compute", name="X", op="all_reduce", group=(0, 1), nbytes=1.0,
                        key="X", mirrors=((2, 3),))]
    assert not sharing.private_collectives(ops, lambda op, group: frozenset({7}), ASYNC, {0: ((2, 3),)})
    assert sharing.private_collectives(ops, lambda op, group: frozenset({group[0]}), ASYNC, {0: ((2, 3),)}) == {0}


def test_a_hand_off_whose_mirror_takes_other_hops_is_never_replayed():
    """A send alone on its links, its mirror on links of their own: replayed, unless its mirror would take
    another time alone (the folded send ends with its slowest copy, which a replay without mirrors drops)."""
    ops = [CollectiveOp(id=0, rank=0, stream="pp", name="S", op="send_recv", group=(0, 1), nbytes=1.0, key="S",
                        mirrors=((2, 3),))]
    asked = []

    def apart(op, mirrors):
        asked.append((op.key, mirrors))
        return True

    assert sharing.private_collectives(ops, _own_links, ASYNC, {0: ((2, 3),)}, timed_apart=lambda op, kept: False) \
        == {0}
    assert not sharing.private_collectives(ops, _own_links, ASYNC, {0: ((2, 3),)}, timed_apart=apart)
    assert asked == [("S", ((2, 3),))]


def _random_program(seed: int, groups: int) -> list:
    """A random program of 6 ranks, generated in one global order (so it is a DAG): compute ops, collectives
    over one of ``groups`` groups on an in-order stream (two sizes, so shapes repeat), and asynchronous sends on
    ``pp``; each op depends, mostly, on the last op of its rank and on up to one earlier op of any rank."""
    rng = np.random.default_rng(seed)
    pool = [tuple(sorted(rng.choice(6, size=int(rng.integers(2, 5)), replace=False).tolist()))
            for _ in range(groups)]
    mirrored = {group: ((tuple(rank + 6 for rank in group),) if rng.random() < 0.3 else ()) for group in pool}
    ops: list = []
    last_of: dict[int, int] = {}

    def deps(rank: int) -> tuple[int, ...]:
        chosen = {last_of[rank]} if rank in last_of and rng.random() < 0.8 else set()
        if ops and rng.random() < 0.3:
            chosen.add(int(rng.integers(len(ops))))
        return tuple(sorted(chosen))

    for step in range(int(rng.integers(30, 60))):
        draw = rng.random()
        if draw < 0.35:
            rank = int(rng.integers(6))
            ops.append(ComputeOp(id=len(ops), rank=rank, stream="compute", name="k", deps=deps(rank)))
            last_of[rank] = len(ops) - 1
            continue
        if draw < 0.6:
            group, stream, name = tuple(sorted(rng.choice(6, size=2, replace=False).tolist())), "pp", "send_recv"
        else:
            group = pool[int(rng.integers(len(pool)))]
            stream, name = str(rng.choice(["compute", "comm", "dp"])), str(rng.choice(["all_reduce", "all_gather"]))
        nbytes = float(rng.choice([1.0, 2.0]))
        members = [CollectiveOp(id=len(ops) + index, rank=rank, stream=stream, name=name, op=name, group=group,
                                nbytes=nbytes, key=f"c{step}", deps=deps(rank), mirrors=mirrored.get(group, ()))
                   for index, rank in enumerate(group)]
        ops += members
        last_of.update((op.rank, op.id) for op in members)
    return ops


def _links(op: CollectiveOp, group: tuple[int, ...]) -> frozenset[int]:
    """Each rank's NIC; groups of three or more also cross a shared spine link (100), big messages a second
    one (101) for groups starting at an even rank."""
    spine = {100} if len(group) > 2 else set()
    if op.nbytes > 1 and group[0] % 2 == 0:
        spine.add(101)
    return frozenset(group) | spine


def _own_links(_op: CollectiveOp, group: tuple[int, ...]) -> frozenset[int]:
    """One link of each group's own (groups of ranks below 16): every group alone on its links."""
    return frozenset({sum(rank << (4 * index) for index, rank in enumerate(group))})


def _straightforward_private(ops: list, async_streams: frozenset[str], mirrors: dict,
                             links: LinkSet = _links) -> frozenset[int]:
    """The definition, pair by pair: a collective instance is private when its own links carry none of its
    mirrors and every other instance whose links (own or mirrored) meet its links is reachable from it, or it
    from that one, in the program's DAG (dependencies, in-order streams, one node per collective key)."""
    graph = nx.DiGraph()
    by_id = {op.id: op for op in ops}
    node = {op.id: ("key", op.key) if isinstance(op, CollectiveOp) else ("op", op.id) for op in ops}
    last: dict[tuple[int, str], tuple] = {}
    for op in ops:
        graph.add_node(node[op.id])
        graph.add_edges_from((node[dep], node[op.id]) for dep in op.deps)
        if op.stream not in async_streams:
            if (op.rank, op.stream) in last:
                graph.add_edge(last[op.rank, op.stream], node[op.id])
            last[op.rank, op.stream] = node[op.id]
    graph.remove_edges_from(list(nx.selfloop_edges(graph)))
    first = {op.key: op for op in reversed(ops) if isinstance(op, CollectiveOp)}
    own = {key: links(op, op.group) for key, op in first.items()}
    mirror_links = {key: frozenset().union(*(links(op, m) for m in mirrors.get(op.id, ())))
                    for key, op in first.items()}
    private = {key for key in first
               if not own[key] & mirror_links[key]
               and all(other == key or not (own[key] | mirror_links[key]) & (own[other] | mirror_links[other])
                       or nx.has_path(graph, ("key", key), ("key", other))
                       or nx.has_path(graph, ("key", other), ("key", key)) for other in first)}
    return frozenset(op.id for op in by_id.values() if isinstance(op, CollectiveOp) and op.key in private)


@pytest.mark.parametrize("seed", range(24))
def test_private_instances_match_the_pairwise_definition(seed):
    """The indexed analysis (bisection over in-order instances, arrays against asynchronous ones) finds
    exactly the instances the pair-by-pair definition does, on random programs with asynchronous sends."""
    ops = _random_program(seed, groups=2 + seed % 4)
    mirrors = {op.id: op.mirrors for op in ops if isinstance(op, CollectiveOp) and op.mirrors}
    private = sharing.private_collectives(ops, _links, ASYNC, mirrors)
    assert private == _straightforward_private(ops, ASYNC, mirrors)
    assert 0 < len(private) < sum(isinstance(op, CollectiveOp) for op in ops)


def test_a_shape_met_by_two_others_in_turn_stays_shared_while_a_lone_group_is_private():
    """The search for a shape stops only once every instance of it has met one: all-reduce P runs twice on
    ranks 0 and 1, all-gather A (ranks 0, 2) may overlap only the first and all-gather B (ranks 1, 3) only the
    second, so neither P is private (nor A, nor B), while C, alone on ranks 4 and 5, is. A search that stopped
    at the first shape meeting P would replay the other P alone."""
    def op(id_, rank, stream, key, name, group, deps=()):
        return CollectiveOp(id=id_, rank=rank, stream=stream, name=key, op=name, group=group, nbytes=1.0, key=key,
                            deps=deps)

    ops = [op(0, 0, "compute", "P1", "all_reduce", (0, 1)), op(1, 1, "compute", "P1", "all_reduce", (0, 1)),
           op(2, 0, "dp", "A", "all_gather", (0, 2)), op(3, 2, "dp", "A", "all_gather", (0, 2)),
           op(4, 0, "compute", "P2", "all_reduce", (0, 1), deps=(2,)), op(5, 1, "compute", "P2", "all_reduce", (0, 1)),
           op(6, 1, "dp", "B", "all_gather", (1, 3), deps=(1,)), op(7, 3, "dp", "B", "all_gather", (1, 3)),
           op(8, 4, "compute", "C", "all_reduce", (4, 5)), op(9, 5, "compute", "C", "all_reduce", (4, 5))]
    assert sharing.private_collectives(ops, _links, ASYNC, {}) == {8, 9}
    assert _straightforward_private(ops, ASYNC, {}) == {8, 9}


@pytest.mark.parametrize("streams", [("comm", "comm"), ("comm", "dp")])
def test_one_group_on_two_streams_is_not_private_where_its_instances_may_overlap(streams):
    """A run with a single group and no mirrors is judged without routing, but its instances still share the
    group's links: two all-reduces over ranks 0 and 1 are private one after the other on one stream, not on
    two streams with nothing ordering them."""
    ops = [CollectiveOp(id=2 * index + rank, rank=rank, stream=stream, name=key, op="all_reduce", group=(0, 1),
                        nbytes=1.0, key=key)
           for index, (key, stream) in enumerate(zip("AB", streams)) for rank in (0, 1)]
    expected = frozenset(range(4)) if streams[0] == streams[1] else frozenset()
    assert sharing.private_collectives(ops, _links, ASYNC, {}) == expected
    assert _straightforward_private(ops, ASYNC, {}) == expected


def _two_stream_group() -> list:
    """Ranks 0 and 1, one group: A on the compute stream, B on the tp stream after A, C on the compute stream
    after B (rank 0's C also after rank 1's B), D on the tp stream after B with nothing ordering it against C."""
    deps = {"B": {0: (0,), 1: (1,)}, "C": {0: (2, 3), 1: (3,)}}
    return [CollectiveOp(id=2 * index + rank, rank=rank, stream=stream, name=key, op="all_gather", group=(0, 1),
                         nbytes=1.0, key=key, deps=deps.get(key, {}).get(rank, ()))
            for index, (key, stream) in enumerate(zip("ABCD", ("compute", "tp", "compute", "tp"))) for rank in (0, 1)]


def test_a_program_too_large_to_order_decides_a_group_on_two_streams_on_one_rank(monkeypatch):
    """Where the program gets no ordering (unfolded runs of many ranks), a group alone on its links whose
    instances run on two streams (TP's collectives beside sequence parallelism's re-gathers) is judged on one
    member rank's ops: A and B, ordered there, are private; C and D, which may overlap, are not; as with the
    whole program's ordering."""
    ops = _two_stream_group()
    expected = frozenset(op.id for op in ops if op.key in "AB")
    assert sharing.private_collectives(ops, _links, ASYNC, {}) == expected
    monkeypatch.setattr("simulator.engine.ordering.ORDERING_BUDGET_BYTES", 0)
    assert sharing.private_collectives(ops, _links, ASYNC, {}) == expected


@pytest.mark.parametrize("seed", range(24))
def test_private_instances_of_a_program_too_large_to_order_are_private(monkeypatch, seed):
    """Judged on one rank's ops, a group alone on its links (each group its own link here; their instances on
    several streams) has instances found private, and only where the pair-by-pair definition finds them so
    (that rank knows less of what happens before what, never more)."""
    monkeypatch.setattr("simulator.engine.ordering.ORDERING_BUDGET_BYTES", 0)
    ops = _random_program(seed, groups=2 + seed % 4)
    mirrors = {op.id: op.mirrors for op in ops if isinstance(op, CollectiveOp) and op.mirrors}
    private = sharing.private_collectives(ops, _own_links, ASYNC, mirrors)
    assert private and private <= _straightforward_private(ops, ASYNC, mirrors, _own_links)


@pytest.mark.parametrize("seed", range(12))
def test_instance_columns_meet_as_each_shape_does_and_as_the_definition_says(seed):
    """`InstanceColumns.meet`, every shape's instances at once, gives for each instance and each shape what
    `Instances.meet` of that shape gives, and that is the definition: some other instance of the shape is
    not ordered before or after it in the program's DAG (random programs with asynchronous sends)."""
    ops = _random_program(seed, groups=2 + seed % 4)
    ordering = Ordering.of(ops, ASYNC)
    keys: dict[tuple, list[str]] = {}
    for op in ops:
        if isinstance(op, CollectiveOp) and op.key not in keys.get((op.op, op.group, op.nbytes), []):
            keys.setdefault((op.op, op.group, op.nbytes), []).append(op.key)
    nodes = [np.array([ordering.node_of_key[key] for key in shape_keys], dtype=np.int64)
             for shape_keys in keys.values()]
    instances = [sharing.Instances.of(ordering, shape_nodes) for shape_nodes in nodes]
    columns = sharing.InstanceColumns(ordering, instances)
    met_any = False
    for shape_nodes in nodes:
        met = columns.meet(shape_nodes)
        assert met.shape == (len(shape_nodes), len(nodes))
        for column, (found, other) in enumerate(zip(instances, nodes)):
            assert met[:, column].tolist() == found.meet(ordering, shape_nodes).tolist()
            assert met[:, column].tolist() == [any(node != each and not ordering.before(node, each)
                                                   and not ordering.before(each, node) for each in other)
                                               for node in shape_nodes.tolist()]
        met_any |= bool(met.any())
    assert met_any


def test_a_program_over_the_ordering_budget_says_so_and_runs_the_same_step(monkeypatch):
    """With a budget of exactly the bytes the Mixtral step's ordering takes (4,508 ops, 3,961 nodes, on 8
    streams, 1.4 MiB)
    it is ordered; a byte less and no ordering is built, each collective is judged on one rank's ops, and the
    summary's `ordering_skipped` and a warning say so, with what it costs: the same step, but fewer collectives
    proved alone and replayed, so more flows on the network (49,260 -> 140,288)."""
    from simulator import simulate
    from simulator.config.loader import load_scenario
    from simulator.engine import ordering

    scenario = SCENARIOS / "mixtral-8x7b-ep8.yaml"
    needed = ordering.OrderingSize(4508, 3961, 8, longest=4508).bytes  # no stream holds more ops than all: 16-bit
    monkeypatch.setattr(ordering, "ORDERING_BUDGET_BYTES", needed)
    ordered = simulate(load_scenario(scenario)).summary
    monkeypatch.setattr(ordering, "ORDERING_BUDGET_BYTES", needed - 1)
    unordered = simulate(load_scenario(scenario)).summary
    assert "ordering_skipped" not in ordered
    assert unordered["ordering_skipped"] == {"ops": 4508, "components": 8, "mib": 1.4}
    assert unordered["warnings"][-1].startswith("collectives not ordered: 4,508 ops on 8 in-order streams need "
                                                "1.4 MiB to order, over the budget of 1.4 MiB")
    assert unordered["step_time_s"] == pytest.approx(ordered["step_time_s"], rel=1e-12)
    assert (ordered["flows_simulated"], unordered["flows_simulated"]) == (49_260, 140_288)


@pytest.mark.parametrize(("scenario", "fold", "overrides"), [
    ("llama3-70b-torchtitan-pp-fsdp", True, []),
    ("deepseek-v3-style-1024-gpus", True, ["parallelism.pipeline.schedule=dualpipev",
                                           "parallelism.pipeline.virtual_stages=2", "training.global_batch=8192"]),
    ("mixtral-8x7b-ep8", False, []),
], ids=["llama3-70b-folded", "deepseek-dualpipev-gb8192", "mixtral-unfolded"])
def test_the_ordering_takes_the_bytes_its_budget_counts(scenario, fold, overrides):
    """`OrderingSize.bytes`, which the budget is checked against, is within 0.9 to 1.35 of the peak that
    tracemalloc measures while the ordering is built (counted / measured MiB with 16-bit clock entries: Llama 3
    70B PP 2 folded, 17,260 ops, 5.3 / 5.3; DualPipeV at global batch 8192, whose asynchronous send chains pass
    979,200 pairs, 73.7 / 66.3; Mixtral unfolded, 72,128 ops on 46,198 nodes, 31.9 / 23.7, its per-op tables
    counted at the 300 B measured with 32-bit clock rows; with 32-bit entries they were 5.6 / 5.6, 85.6 / 79.2
    and 43.2 / 35.0), so the budget bounds what it protects."""
    import tracemalloc

    from simulator.config.loader import load_scenario
    from simulator.engine import ordering
    from simulator.simulation import step_program
    from simulator.topology.loader import scenario_topology

    loaded = load_scenario(SCENARIOS / f"{scenario}.yaml", overrides)
    program = step_program(loaded, scenario_topology(loaded), fold=fold)
    tracemalloc.start()
    try:
        components, columns, nodes = ordering._components(program.ops, program.async_streams)
        graph = ordering._graph(program.ops, components)
        ordering.Ordering(graph, columns)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = ordering.OrderingSize(len(program.ops), nodes, columns, graph.passed_pairs,
                                 ordering.longest_component(components))
    assert 0.9 <= size.bytes / peak <= 1.35
