"""Sequence parallelism's backward re-gather: the column-parallel linears (QKV, the first MLP GEMMs, the output
layer) save their input sharded, so each block's backward all-gathers it again beside the input-gradient GEMMs
and the weight-gradient GEMMs wait for it (Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication;
Transformer Engine's bulk overlap under tp_comm_overlap). Traffic and exposed time against closed forms."""

from __future__ import annotations

import pytest
from shared import EXACT

from simulator.catalog.gpus import get_gpu
from simulator.catalog.models import get_model
from simulator.collectives.execute import time_collective
from simulator.collectives.protocols import BASE_LATENCY_US
from simulator.config.loader import scenario_from_text
from simulator.metrics.intervals import uncovered
from simulator.simulation import network_settings
from simulator.topology.loader import scenario_topology
from simulator.workload.calibrated import calibrated_efficiency, tp_overlap
from simulator.workload.roofline import kernels_duration
from simulator.workload.transformer import ShardShape, head_kernels, layer_kernels

NVLINK_LATENCY = 3.4e-6
"""dgx-h100's path latency between two GPUs (NCCL's Simple ring latency per NVLink hop, tuning.cc)."""
SEQ, HIDDEN, TP, LAYERS, MICROBATCHES = 4096, 8192, 8, 2, 2
MESSAGE = SEQ * HIDDEN * 2
"""One TP collective's per-rank buffer: b x s x h x 2 B."""

TRAFFIC = f"""
cluster: {{topology: dgx-h100}}
model: {{preset: llama3-70b, layers: {LAYERS}}}
training: {{seq_len: {SEQ}, microbatches: {MICROBATCHES}, micro_batch: 1, precision: bf16}}
parallelism: {{tp: {TP}, dp: 1, sequence_parallel: true}}
collectives: {{algorithm: ring}}
"""


@pytest.mark.parametrize(("overrides", "per_microbatch"), [
    # Forward: all-gather and reduce-scatter around each block (4 per layer), the embedding's reduce-scatter and
    # the head's all-gather; backward: the same 4 per layer plus the re-gathers of the QKV and MLP inputs, and
    # the head's reduce-scatter and re-gather: 10 L + 4 ring passes of (t - 1) / t of the message.
    ((), 10 * LAYERS + 4),
    (("parallelism.tp_comm_overlap=true",), 10 * LAYERS + 4),
    # Full recompute runs the layers' forward collectives again (4 per layer); the recomputed forward saves its
    # input sharded again, so the backward still re-gathers it: 14 L + 4.
    (("training.recompute=full",), 14 * LAYERS + 4),
    # Without sequence parallelism: an all-reduce (2 ring passes) after each block's forward and backward, after
    # the embedding's forward and the head's backward, and nothing to re-gather: 8 L + 4.
    (("parallelism.sequence_parallel=false",), 8 * LAYERS + 4),
])
def test_tp_traffic_per_micro_batch_is_the_closed_form(run_yaml, overrides, per_microbatch):
    summary = run_yaml(TRAFFIC, *overrides).summary
    expected = MICROBATCHES * per_microbatch * (TP - 1) / TP * MESSAGE
    assert summary["traffic_bytes_per_gpu"]["tp"] == pytest.approx(expected, rel=EXACT)


def test_zero_bubble_b_waits_for_its_gather_before_the_w(run_yaml):
    # Two stages of one layer each: the embedding's reduce-scatter on the first, the head's three on the last,
    # 10 per layer: (10 L + 4) / 2 per GPU and micro-batch.
    result = run_yaml(TRAFFIC.replace("tp: 8, dp: 1", "tp: 4, pp: 2, dp: 1"),
                      "parallelism.pipeline.schedule=zb-h1")
    expected = MICROBATCHES * (10 * LAYERS + 4) / 2 * (4 - 1) / 4 * MESSAGE
    assert result.summary["traffic_bytes_per_gpu"]["tp"] == pytest.approx(expected, rel=EXACT)
    ops = result.timeline[(result.timeline["kind"] != "flow")]
    gathers = ops[ops["name"].str.endswith("(input again)")]
    # A B waits for its gather after the input-gradient GEMM and keeps the input for its W; a whole backward
    # (BW) gathers for its own weight-gradient GEMM.
    weights = ops[ops["name"].str.startswith("W") | ops["name"].str.endswith(" wgrad")]
    weights = weights[~weights["name"].str.contains("embedding")]
    assert len(gathers) == len(weights) and weights["name"].str.startswith("W").any()
    for gather in gathers.itertuples():
        block = gather.name.split()[2]
        w = weights[(weights["rank"] == gather.rank) & (weights["microbatch"] == gather.microbatch)
                    & weights["name"].str.contains(f" {block}")]
        assert len(w) == 1 and w["start_s"].iloc[0] >= gather.end_s
        scatter = ops[(ops["rank"] == gather.rank) & (ops["microbatch"] == gather.microbatch)
                      & (ops["name"] == f"tp reduce_scatter {block}") & (ops["start_s"] >= gather.start_s)]
        assert scatter["start_s"].min() >= gather.end_s


ONE_LAYER = """
cluster: {topology: dgx-h100}
model: {preset: llama3-70b, layers: 1}
training: {seq_len: 4096, microbatches: 1, micro_batch: 1, precision: bf16}
parallelism: {tp: 8, dp: 1, sequence_parallel: true}
collectives: {sm_contention: none}
"""


def _column_gemms() -> dict[str, tuple[float, float]]:
    """(input-gradient, weight-gradient) seconds of each block's column-parallel GEMMs on an H100, by hand from
    the kernel model: QKV, gate and up, the output layer."""
    model, shard = get_model("llama3-70b"), ShardShape(1, 4096, tp=8, sequence_parallel=True)
    gpu, efficiency = get_gpu("h100-sxm"), calibrated_efficiency("h100-sxm")
    layer, head = layer_kernels(model, shard), head_kernels(model, shard)

    def seconds(kernels, names, suffix):
        return kernels_duration(tuple(k for k in kernels if k.name in {f"{n}.{suffix}" for n in names}), gpu, "bf16",
                                efficiency)

    parts = {"L0.attn": (layer, ("qkv_proj",)), "L0.mlp": (layer, ("mlp_gate", "mlp_up")), "head": (head, ("lm_head",))}
    return {block: (seconds(kernels.backward_input, names, "dgrad"), seconds(kernels.backward_weight, names, "wgrad"))
            for block, (kernels, names) in parts.items()}


def _rank0(result):
    frame = result.timeline
    return frame[(frame["rank"] == 0) & (frame["kind"] != "flow")]


def _one_collective(ops) -> float:
    """The duration every whole TP collective of this case takes (same bytes, same group, nothing beside it)."""
    whole = ops[ops["category"] == "tp"]
    durations = (whole["end_s"] - whole["start_s"]).to_numpy()
    assert durations.max() == pytest.approx(durations.min(), rel=EXACT)
    return float(durations[0])


def _check_backward(ops, gemms, collective, bulk: bool) -> float:
    """Each block's re-gather starts with its input-gradient GEMM, the weight-gradient GEMM starts when both
    have ended (and, in bulk, the input gradient's reduce-scatter with it); returns the exposed seconds of the
    re-gathers and bulk reduce-scatters: max(0, collective - GEMM) each."""
    exposed = 0.0
    for block, (dgrad_s, wgrad_s) in gemms.items():
        gather = ops[ops["name"] == f"tp all_gather {block} (input again)"].iloc[0]
        dgrad = ops[ops["name"] == f"B0 {block} dgrad"].iloc[0]
        wgrad = ops[ops["name"] == f"B0 {block} wgrad"].iloc[0]
        assert gather.start_s == dgrad.start_s
        assert dgrad.end_s - dgrad.start_s == pytest.approx(dgrad_s, rel=EXACT)
        assert wgrad.end_s - wgrad.start_s == pytest.approx(wgrad_s, rel=EXACT)
        assert wgrad.start_s == pytest.approx(dgrad.start_s + max(dgrad_s, collective), rel=EXACT)
        exposed += max(0.0, collective - dgrad_s)
        if bulk:
            scatter = ops[ops["name"] == f"tp reduce_scatter {block} (bulk)"].iloc[0]
            assert scatter.start_s == wgrad.start_s
            exposed += max(0.0, collective - wgrad_s)
    return exposed


def test_exposed_tp_time_without_overlap_is_the_blocking_collectives_and_the_regathers_overhang(run_yaml):
    result = run_yaml(ONE_LAYER)
    ops = _rank0(result)
    d = _one_collective(ops)
    gemms = _column_gemms()
    # The attention block's QKV input-gradient GEMM is shorter than the gather (GQA: 1,280 columns per rank),
    # so part of that gather is exposed; the MLP's and the head's hide.
    assert gemms["L0.attn"][0] < d < min(gemms["L0.mlp"][0], gemms["head"][0])
    regathers = _check_backward(ops, gemms, d, bulk=False)
    # Blocking, on the compute stream: forward 4 per layer + the embedding's and the head's; backward 4 per
    # layer + the head's reduce-scatter: 11 collectives.
    assert result.summary["exposed_comm_s"]["tp"] == pytest.approx(11 * d + regathers, rel=1e-6)
    assert result.summary["comm_s"]["tp"] == pytest.approx(14 * d, rel=1e-6)


def _overlapped_gemms() -> dict[str, float]:
    """Seconds of the GEMMs next to the chunked TP collectives on an H100, by hand from the kernel model: the
    ring exchanges' (QKV and FC1 forward, projection and FC2 input gradient) and the pipelined reduce-scatters'
    (projection and FC2 forward), keyed by the op that runs them."""
    model, shard = get_model("llama3-70b"), ShardShape(1, 4096, tp=8, sequence_parallel=True)
    gpu, efficiency = get_gpu("h100-sxm"), calibrated_efficiency("h100-sxm")
    layer = layer_kernels(model, shard)

    def seconds(kernels, *names):
        return kernels_duration(tuple(k for k in kernels if k.name in names), gpu, "bf16", efficiency)

    return {"F0 L0.attn all_gather": seconds(layer.forward, "qkv_proj"),
            "F0 L0.mlp all_gather": seconds(layer.forward, "mlp_gate", "mlp_up"),
            "B0 L0.attn all_gather": seconds(layer.backward_input, "out_proj.dgrad"),
            "B0 L0.mlp all_gather": seconds(layer.backward_input, "mlp_down.dgrad"),
            "F0 L0.attn reduce_scatter": seconds(layer.forward, "out_proj"),
            "F0 L0.mlp reduce_scatter": seconds(layer.forward, "mlp_down")}


def _ring_exchange_end(start: float, swap_s: float, exchange_s: float, gemm_s: float, steps: int) -> float:
    """When the GEMM beside an aggregated ring exchange ends, one step at a time as Transformer Engine runs it:
    after the pair swap, GEMM step k runs on the chunks present and step k + 1 starts when it and exchange k
    (the ring's steps - 1 exchanges, equal) have ended."""
    gemm_end = exchange_end = start + swap_s
    for step in range(steps):
        gemm_end = max(gemm_end, exchange_end) + gemm_s / steps
        if step < steps - 1:
            exchange_end += exchange_s / (steps - 1)
    return gemm_end


def _pipeline_end(start: float, chunk_s: float, gemm_s: float, chunks: int) -> float:
    """When the last chunk of a pipelined reduce-scatter ends, chunk by chunk: GEMM chunks back to back from
    ``start``, chunk k's reduce-scatter (``chunk_s`` each) once its GEMM chunk and the reduce-scatter before it
    have ended."""
    gemm_end = scatter_end = start
    for _ in range(chunks):
        gemm_end += gemm_s / chunks
        scatter_end = max(scatter_end, gemm_end) + chunk_s
    return scatter_end


def _userbuffers_s(ring_s: float, fraction: float = 1.0) -> float:
    """One userbuffers reduce-scatter or all-gather over the 8 GPUs of ``fraction`` of the message, from the NCCL
    ring's ``ring_s`` for the whole message (Simple): the ring pays NCCL's base latency b and 7 hop latencies a
    beside its 7/8 n over NVLink; the userbuffers kernel one latency a beside the same bytes."""
    a, b = NVLINK_LATENCY, BASE_LATENCY_US["ring"]["simple"] * 1e-6
    return a + (ring_s - b - (TP - 1) * a) * fraction


def _ring_exchange_s(ring_s: float, members: int) -> float:
    """A ring exchange of the whole message over ``members`` GPUs (every other one of the 8 when aggregated), from
    the NCCL ring's ``ring_s`` over the 8 (Simple), whose 7/8 n over NVLink take ring_s - b - 7 a: members - 1
    copies of n/members to the next GPU, one after the other, each paying the latency a, none of NCCL's base
    latency b (Transformer Engine's userbuffers sends and receives launch no NCCL kernel)."""
    a, b = NVLINK_LATENCY, BASE_LATENCY_US["ring"]["simple"] * 1e-6
    nvlink_s = (ring_s - b - (TP - 1) * a) * TP / (TP - 1)
    return (members - 1) * (a + nvlink_s / members)


def test_exposed_tp_time_with_overlap_is_the_ring_exchanges_pipelines_and_bulk_overhangs(run_yaml, catalog_sources):
    result = run_yaml(ONE_LAYER, "parallelism.tp_comm_overlap=true")
    assert scenario_topology(scenario_from_text(ONE_LAYER)).path_latency(0, 1) == pytest.approx(NVLINK_LATENCY)
    ops = _rank0(result)
    overlap, method = tp_overlap(), catalog_sources["tp_comm_overlap_method"]
    assert (overlap.aggregate, overlap.chunks) == (method["aggregate"], method["num_splits"]) == (True, 4)
    tp = ops[ops["category"] == "tp"]
    # Blocking, whole, by NCCL's ring: the embedding's reduce-scatter (it follows a lookup, not a GEMM) and the
    # output layer's all-gather (Megatron-core's own ColumnParallelLinear, no userbuffers).
    whole = tp[tp["stream"] == "compute"]
    assert sorted(whole["name"]) == ["tp all_gather head", "tp reduce_scatter embedding"]
    durations = (whole["end_s"] - whole["start_s"]).to_numpy()
    assert durations.max() == pytest.approx(durations.min(), rel=EXACT)
    d = float(durations[0])
    # The bulk re-gathers and reduce-scatters are userbuffers kernels: one latency, not NCCL's base and 7 hops.
    bulk = _check_backward(ops, _column_gemms(), _userbuffers_s(d), bulk=True)

    def one(name: str, phase: str = "fwd"):
        """The op ``name``; a collective of the pass ``phase`` (its key names it)."""
        rows = ops[(ops["name"] == name) & ((ops["kind"] == "compute") | ops["key"].str.startswith(f"tp.{phase}."))]
        assert len(rows) == 1, name
        return rows.iloc[0]

    gemms, exposed = _overlapped_gemms(), 2 * d + bulk
    steps, chunks = TP // 2, overlap.chunks
    for key, gemm_s in gemms.items():
        pass_name, block, op = key.split()
        phase = "fwd" if pass_name == "F0" else "bwd"
        if op == "all_gather":
            last = one(f"{pass_name} {block} gemm (last step)")
            # The pair swap moves one chunk (1/8 of the message) each way and every GEMM step waits for it; the
            # ring then moves the other six chunks two at a time beside the first three GEMM steps.
            swap, ring = (one(f"tp all_gather {block} (pair exchange)", phase),
                          one(f"tp all_gather {block} (ring exchange)", phase))
            assert swap.bytes == pytest.approx(2 * MESSAGE / TP, rel=EXACT)
            assert ring.bytes == pytest.approx(MESSAGE, rel=EXACT) and ring.start_s == swap.end_s
            swap_s, ring_s = swap.end_s - swap.start_s, ring.end_s - ring.start_s
            assert ring_s == pytest.approx(_ring_exchange_s(d, steps), rel=EXACT)
            assert last.end_s == pytest.approx(
                _ring_exchange_end(swap.start_s, swap_s, ring_s, gemm_s, steps), rel=EXACT)
            # Exposed: the swap, and what the ring's exchanges outlast the GEMM steps beside them by.
            exposed += swap_s + max(0.0, ring_s - gemm_s * (steps - 1) / steps)
        else:
            scatters = [one(f"tp reduce_scatter {block} (chunk {k} of {chunks})") for k in range(1, chunks + 1)]
            gemm_chunks = [one(f"{pass_name} {block} gemm (chunk {k} of {chunks})") for k in range(1, chunks + 1)]
            # One userbuffers kernel per chunk, each a quarter of the message and one latency of its own.
            for scatter in scatters:
                assert scatter.end_s - scatter.start_s == pytest.approx(_userbuffers_s(d, 1 / chunks), rel=EXACT)
            assert scatters[-1].end_s == pytest.approx(
                _pipeline_end(gemm_chunks[0].start_s, _userbuffers_s(d, 1 / chunks), gemm_s, chunks), rel=EXACT)
            # Exposed: what the reduce-scatters outlast the last GEMM chunk by.
            exposed += scatters[-1].end_s - gemm_chunks[-1].end_s
    # The MLP's FC1 GEMM hides its ring (GEMM-bound: only the one-chunk swap shows); the attention's QKV GEMM (GQA,
    # 1,280 columns per rank) does not (communication-bound: the swap and the ring's excess over the GEMM steps).
    fc1, qkv = one("F0 L0.mlp gemm (first steps)"), one("F0 L0.attn gemm (first steps)")
    assert fc1.end_s > one("tp all_gather L0.mlp (ring exchange)").end_s
    assert qkv.end_s < one("tp all_gather L0.attn (ring exchange)").end_s
    assert result.summary["exposed_comm_s"]["tp"] == pytest.approx(exposed, rel=1e-6)


@pytest.mark.parametrize(("block", "gemm_bound"), [("L0.mlp", True), ("L0.attn", False)])
def test_ring_exchange_exposes_the_pair_swap_and_what_the_ring_outlasts_its_gemm_steps_by(run_yaml, block,
                                                                                         gemm_bound):
    """Transformer Engine's aggregated ring exchange at TP 8 (NeMo's Llama 3 405B settings): each GPU pair swaps
    one chunk (1/8 of the message) before the first GEMM step, then 3 exchanges of two chunks each with the GPU
    two along run beside the first 3 of the GEMM's 4 steps. Exposed: the swap, plus max(0, ring - 3/4 GEMM).
    The MLP's FC1 GEMM (7,168 columns per rank) outlasts its ring: only the swap shows, one chunk's time over
    NVLink. The attention's QKV GEMM (GQA: 1,280 columns) does not: it exposes the communication less the
    GEMM steps beside it. The swap and ring from the collective model alone, the GEMM from the kernel model."""
    loaded = scenario_from_text(ONE_LAYER, "inline.yaml", ["parallelism.tp_comm_overlap=true"])
    topology = scenario_topology(loaded)
    settings = network_settings(loaded, topology)

    def alone(algorithm, ranks, nbytes):
        return time_collective(topology, "all_gather", algorithm, ranks, nbytes, efficiency=dict(settings.efficiency))

    swap = alone("userbuffers", (0, 1), 2 * MESSAGE / TP)
    ring = alone("ring_exchange", (0, 2, 4, 6), MESSAGE)
    gemm = _overlapped_gemms()[f"F0 {block} all_gather"]
    assert (ring > 3 / 4 * gemm) is not gemm_bound
    ops = _rank0(run_yaml(ONE_LAYER, "parallelism.tp_comm_overlap=true"))
    gather = ops[ops["name"].str.startswith(f"tp all_gather {block} (") & ops["key"].str.startswith("tp.fwd.")]
    compute = ops[ops["kind"] == "compute"]
    exposed = uncovered(gather["start_s"].to_numpy(), gather["end_s"].to_numpy(), compute["start_s"].to_numpy(),
                        compute["end_s"].to_numpy())
    assert exposed == pytest.approx(swap + max(0.0, ring - 3 / 4 * gemm), rel=1e-9)


def test_bulk_overlap_holds_the_userbuffers_sms_of_the_nemo_settings(catalog_sources):
    overlap, held = tp_overlap(), catalog_sources["tp_comm_overlap_sms"]
    assert (overlap.bulk_all_gather_sms, overlap.bulk_reduce_scatter_sms) == (held["bulk_all_gather"],
                                                                             held["bulk_reduce_scatter"])
