"""Happens-before between collective instances (engine/ordering.py) and the per-instance replay it allows:
an instance that no concurrent traffic meets is timed alone, which must not change the step."""

from __future__ import annotations

import pytest

from simulator.engine import sharing
from simulator.engine.ordering import Ordering
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
    ordering = Ordering(_program(), ASYNC)
    x, s, y = (ordering.node_of_key[key] for key in ("X", "S", "Y"))
    c = ordering.node_of_op[6]
    assert ordering.before(x, c) and not ordering.before(c, x)  # X on rank 1's compute stream precedes C
    assert ordering.before(s, c)  # C waits for the asynchronous send
    assert ordering.concurrent(x, s)  # the send may run while X does
    assert ordering.concurrent(y, x) and ordering.concurrent(y, s)
    assert not ordering.concurrent(x, x)


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

    def none_private(ops, links_of, async_streams, mirrors):
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
