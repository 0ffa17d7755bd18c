"""One rule for a collective's pipelining chunk, however it is given (the schema's `collectives.chunk`, `trainsim
collective --chunk`, a request to plan); kept apart from the registry so that the schema loads no algorithm."""

from __future__ import annotations

import math
from typing import Literal

from simulator.collectives.names import Protocol
from simulator.errors import InputError, ScenarioError
from simulator.units import parse_message_size, whole_bytes

CHUNK_FIELD = "collectives.chunk"
CHUNK_ALLOWED = ("auto for NCCL's chunk of the protocol, whole bytes from 1 B up to 1 PiB such as 512 KiB, or none "
                 "(off) to turn chunking off")
CHUNKING_OFF = ("none", "off")
AUTO_CHUNK: Literal["auto"] = "auto"
"""The default chunk: NCCL's for the protocol the collective runs under (`nccl_chunk`)."""
ChunkSetting = float | Literal["auto"] | None
"""A pipelining chunk as given: bytes, `auto` (NCCL's), or None (no chunking)."""

NCCL_STEPS = 8
"""Chunk steps a connection keeps in flight: NCCL's ``NCCL_STEPS`` (src/include/device.h), the slots of a
protocol's buffer; under Simple the sender fills them before it waits for the receiver's credit
(src/device/prims_simple.h)."""
STEP_BYTES: dict[Protocol, int] = {
    "simple": 2**22 // NCCL_STEPS,
    "ll": 8 * 512 * NCCL_STEPS * 16 // NCCL_STEPS // 2,
    "ll128": 120 * 640 * NCCL_STEPS * 8 // NCCL_STEPS * 15 // 16,
}
"""The data bytes of one step of a connection's buffer per protocol, NCCL's chunk for a chain and a tree (NCCL
2.30.7: `calcCollChunking` in src/enqueue.cc takes chunkSize = buffSize / NCCL_STEPS x chunkSteps, chunkSteps 1
but for the Simple ring's all-reduce/all-gather/reduce-scatter, and `BROADCAST_CHUNKSTEPS` = `REDUCE_CHUNKSTEPS`
= 1 in src/include/collectives.h): Simple's 4 MiB buffer (init.cc `DEFAULT_BUFFSIZE`) gives 512 KiB; LL's 8 lines
x 512 threads x 8 steps of 16 B, half of them flags, 32 KiB; LL128's 120 words x 640 threads x 8 steps of 8 B,
15 of each 16 words data, 576,000 B."""
LL128_GRAIN = 32 * 8 // 16 * 15 * 8
"""LL128's chunk granularity in bytes (device.h `ncclProtoGrainSize`: a warp's lines of shared memory)."""


def nccl_chunk(protocol: Protocol, share: float, tree_nodes: tuple[int, float] | None = None) -> float:
    """NCCL's pipelining chunk for a chain or tree moving ``share`` bytes per channel under ``protocol``: one
    buffer step (`STEP_BYTES`), which the LL128 tree halves while the share makes too few chunks for the tree's
    depth (enqueue.cc: nsteps = 1 + log2(nodes) + ppn / 10; halved while chunks < 64 nsteps / ppn, down to
    128 KiB, then while chunks < 16 nsteps / ppn, down to 32 KiB; then cut to whole 1,920 B grains).
    ``tree_nodes`` is a tree's (NCCL's nodes, members per node: `tree.tree_shape`); None for a chain."""
    chunk = STEP_BYTES[protocol]
    if protocol == "ll128" and tree_nodes is not None:
        nodes, ppn = tree_nodes
        nsteps = 1 + int(math.log2(nodes)) + 0.1 * ppn
        while share // chunk < nsteps * 64 / ppn and chunk > 131072:
            chunk //= 2
        while share // chunk < nsteps * 16 / ppn and chunk > 32768:
            chunk //= 2
        chunk = chunk // LL128_GRAIN * LL128_GRAIN
    return float(chunk)


def pipeline_chunk(setting: ChunkSetting, protocol: Protocol, share: float,
                   tree_nodes: tuple[int, float] | None = None) -> float | None:
    """The chunk a chain or tree moving ``share`` bytes per channel under ``protocol`` pipelines in: the one
    given, NCCL's (`nccl_chunk`) for `auto`, None for no chunking."""
    if setting == AUTO_CHUNK:
        return nccl_chunk(protocol, share, tree_nodes)
    return setting


def chunk_bytes(value: object) -> ChunkSetting:
    """The pipelining chunk a user gives (`collectives.chunk`, `trainsim collective --chunk`): `auto` (NCCL's for
    the protocol), a size, or none (also `off`, which YAML reads as false) for no chunking."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in CHUNKING_OFF):
        return None
    if isinstance(value, str) and value.strip().lower() == AUTO_CHUNK:
        return AUTO_CHUNK
    try:
        nbytes = parse_message_size(value)
    except InputError as exc:
        raise exc.rebuilt(ScenarioError, field=CHUNK_FIELD, allowed=CHUNK_ALLOWED) from None
    check_chunk(nbytes, value)
    return nbytes


def check_chunk(nbytes: ChunkSetting, written: object = None) -> None:
    """The one check of a pipelining chunk (None: no chunking; `auto`: NCCL's): whole bytes, at least 1 B,
    however it was given (a chunk of 1e-20 B cut a tree's buffer into 1e26 chunks)."""
    if nbytes is None or nbytes == AUTO_CHUNK:
        return
    shown = nbytes if written is None else written
    if not nbytes > 0:
        raise ScenarioError(f"chunk {shown!r} is not positive", field=CHUNK_FIELD, allowed=CHUNK_ALLOWED)
    try:
        whole_bytes(nbytes, shown, CHUNK_ALLOWED)
    except InputError as exc:
        raise exc.rebuilt(ScenarioError, field=CHUNK_FIELD, allowed=CHUNK_ALLOWED) from None
