"""Checkpoint and restart costs of one cluster state, from the checkpoint, storage and restart sections.

Size: the model's parameters times `bytes_per_param`, by default what the scenario's framework saves for its layout
and precision (`layout_bytes_per_param`: 14 B for bf16 with Adam under Megatron-LM or DeepSpeed, 12 B under PyTorch
FSDP2), unless `checkpoint.size` is given. Every host of the job writes its shard to the remote store over its NICs:
write time = size / min(hosts x min(per-host write bandwidth, the host's NIC bandwidth), aggregate write cap); a
restart reads it back the same way. `sync`: training stalls for the write. `async`: it stalls for the snapshot of
each GPU's shard from HBM to host memory (size / GPUs / snapshot bandwidth), then the write runs in the background
and shares the host's network links with training traffic: the write takes a share f = per-host write rate / host
network bandwidth of every link (at most `MAX_WRITE_NETWORK_SHARE`, which a host whose NICs bound the write
reaches), so the step's exposed network communication (every category but tensor-parallel, which stays on NVLink)
stretches by 1 / (1 - f) while a write runs; the step slows by sigma = exposed network share x f / (1 - f).

In-memory tier (`checkpoint.memory`): every `interval` each GPU's shard (size / GPUs) goes to host RAM and to
`replicas` peer hosts at the tier's `bandwidth`, a stall of size / GPUs x copies / bandwidth, copies the peers the
state's hosts hold (`peer_copies`: a job shrunk to fewer hosts has fewer); a restore from peer memory reads one
shard per GPU back at that bandwidth, size / GPUs / bandwidth.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from simulator.config.reliability import CheckpointConfig, CheckpointMode, RestartConfig, StorageConfig
from simulator.config.schema import Scenario
from simulator.workload.memory import state_bytes_per_param

NO_SNAPSHOT_TAKEN = "each storage checkpoint restarts the snapshots' count, so none would be taken"
"""Why an in-memory interval that `takes_no_snapshot` is refused, as each refusal of one says it."""

MAX_WRITE_NETWORK_SHARE = 0.99
"""The most of a host's network bandwidth a background checkpoint write is taken to hold. The exposed network
time of a step grows by f / (1 - f) at share f, without bound as f nears 1 (a write at the host's full network
bandwidth, the most `_over_nics` allows); capped here, such a write slows that time at most 99-fold instead of
dividing by zero."""


@dataclass(frozen=True)
class StepState:
    """A cluster state's step as the engine simulated it: time, tokens (0 for a model without tokens: synthetic
    stage costs), micro-batches over all data-parallel replicas (its work), the share
    of the step that is exposed network communication, and the hosts and GPUs it ran on."""

    step_s: float
    tokens_per_step: float
    microbatches: int
    exposed_network_share: float
    hosts: int
    gpus: int
    host_network_bandwidth: float


class Cycle(NamedTuple):
    """One whole checkpoint cycle in steady state (s): training (with the background write's slowdown),
    the stall, the extra time the slowdown adds and the period (training + stall)."""

    train_s: float
    stall_s: float
    slow_s: float
    period_s: float


@dataclass(frozen=True)
class SegmentCosts:
    """What training costs in one cluster state between interruptions, and what a restart into it costs."""

    step_s: float
    equivalent_step_s: float
    tokens_per_step: float
    interval_steps: int
    mode: CheckpointMode
    stall_s: float
    write_s: float
    slowdown: float
    load_s: float
    warmup_s: float
    memory_interval_steps: int = 0
    """Steps between in-memory snapshots; 0 without an in-memory tier."""
    memory_stall_s: float = 0.0
    memory_load_s: float = 0.0

    @property
    def memory_tier_idle(self) -> bool:
        """Whether the state has an in-memory tier that takes no snapshot in its own steps (`takes_no_snapshot`)."""
        return bool(self.memory_interval_steps) and takes_no_snapshot(self.memory_interval_steps, self.interval_steps)

    @cached_property
    def cycle(self) -> Cycle:
        """Sync: k steps, then the write as a stall. Async: k steps, slowed while the previous write runs,
        then the snapshot stall, after waiting for that write if it outlasts the k steps."""
        k, step = self.interval_steps, self.step_s
        if self.mode == "sync":
            train, stall, slow = k * step, self.stall_s, 0.0
        elif self.write_s <= k * step * (1.0 + self.slowdown):
            slow = self.write_s * self.slowdown / (1.0 + self.slowdown)
            train, stall = k * step + slow, self.stall_s
        else:
            slow = k * step * self.slowdown
            train = k * step * (1.0 + self.slowdown)
            stall = self.write_s - k * step * (1.0 + self.slowdown) + self.stall_s
        return Cycle(train, stall, slow, train + stall)


def takes_no_snapshot(memory: float, storage: float) -> bool:
    """Whether in-memory snapshots every ``memory`` are never taken between storage checkpoints every ``storage``
    (both in one unit: steps, or seconds): each storage checkpoint restarts the snapshots' count, so an interval
    not shorter than the storage one never comes round. The one rule behind the refusals of such a tier (at load,
    in the healthy state's steps, at a study's `--intervals`) and the warning of the states the job met."""
    return memory >= storage


def layout_bytes_per_param(scenario: Scenario) -> float:
    """Bytes per parameter of the checkpoint a framework saves for the scenario's layout and precision: the
    weights and the optimizer state (fp32 master copy, the optimizer's moments), no gradients, which a restart
    does not need (state_bytes_per_param without the gradient buffer). Megatron-LM's distributed optimizer
    (`dist_checkpointing` saves the bf16 model and the fp32 main parameters with Adam's exp_avg and exp_avg_sq),
    DeepSpeed ZeRO (its bf16 module states and fp32 optimizer partitions) and FSDP1's `shard_grad_op` and
    `no_shard` (the training precision's weights with an fp32 master copy): 2 + 4 + 8 = 14 B for bf16 or fp16
    with Adam. PyTorch FSDP2 (`fsdp: full_shard | hybrid_shard`, torchtitan's DCP state dict) and eager kernels
    keep fp32 weights and no master copy (Sharding.fp32_shards): 4 + 8 = 12 B, as fp32 training does."""
    training = scenario.training
    fp32_weights = training.kernels == "eager" or scenario.parallelism.gathers_per_unit
    state = state_bytes_per_param(training.precision, training.optimizer, fp32_weights=fp32_weights)
    return state.param + state.optimizer


def checkpoint_bytes(scenario: Scenario, params: float) -> float:
    """The checkpoint's size: `checkpoint.size`, else ``params`` times `bytes_per_param` (by default
    `layout_bytes_per_param`)."""
    config = scenario.checkpoint
    if config.size is not None:
        return config.size
    per_param = config.bytes_per_param if config.bytes_per_param is not None else layout_bytes_per_param(scenario)
    return params * per_param


def segment_costs(step: StepState, healthy: StepState, size: float, config: CheckpointConfig,
                  storage: StorageConfig, restart: RestartConfig) -> SegmentCosts:
    """Checkpoint interval, stall, background write, slowdown and restart costs in state ``step``. The store is
    remote (StorageConfig: Tectonic), so each host writes and reads its shard over its NICs: at most
    `host_write` (`host_read`) and at most its network bandwidth, where the state knows it (a cluster of
    several NVLink domains)."""
    write_rate = min(step.hosts * _over_nics(storage.host_write, step), storage.write)
    write_s = size / write_rate
    load_s = size / min(step.hosts * _over_nics(storage.host_read, step), storage.read)
    interval = interval_steps(config.interval, step.step_s)
    share = 0.0
    if step.host_network_bandwidth > 0:
        share = min(write_rate / step.hosts / step.host_network_bandwidth, MAX_WRITE_NETWORK_SHARE)
    if config.mode == "sync":
        stall, slowdown = write_s, 0.0
    else:
        stall = size / step.gpus / config.snapshot_bandwidth
        slowdown = step.exposed_network_share * share / (1.0 - share)
    memory_interval, memory_stall, memory_load = 0, 0.0, 0.0
    if config.memory is not None:
        shard = size / step.gpus
        memory_interval = interval_steps(config.memory.interval, step.step_s)
        memory_stall = shard * peer_copies(config.memory.replicas, step.hosts) / config.memory.bandwidth
        memory_load = shard / config.memory.bandwidth
    # A step's work is its replicas' micro-batches (a shrunk job keeps each replica's, or the global batch), so
    # its tokens scale with them; counted by micro-batches, a model without tokens has a healthy-equivalent step.
    equivalent = healthy.step_s * (step.microbatches / healthy.microbatches)  # exactly step_s when healthy
    return SegmentCosts(step_s=step.step_s, equivalent_step_s=equivalent, tokens_per_step=step.tokens_per_step,
                        interval_steps=interval, mode=config.mode, stall_s=stall, write_s=write_s,
                        slowdown=slowdown, load_s=load_s, warmup_s=restart.warmup_steps * step.step_s,
                        memory_interval_steps=memory_interval, memory_stall_s=memory_stall,
                        memory_load_s=memory_load)


def _over_nics(rate: float, step: StepState) -> float:
    """A host's storage ``rate`` bounded by its network bandwidth (its NICs), where ``step`` knows it."""
    return min(rate, step.host_network_bandwidth) if step.host_network_bandwidth > 0 else rate


def peer_copies(replicas: int, hosts: int) -> int:
    """The peer hosts that hold each host's in-memory snapshot on ``hosts`` hosts: `replicas`, at most every
    other host (an elastic job shrunk to 2 hosts keeps 1 copy of 3, on 1 host none)."""
    return min(replicas, hosts - 1)


def snapshot_survives(lost: Iterable[int], hosts: int, replicas: int) -> bool:
    """Whether every host in ``lost`` (of ``hosts`` in use) has its in-memory snapshot on a host left: host h's
    copies are on the next `peer_copies` hosts around a ring in host order (h + 1, ..., h + r modulo ``hosts``).
    False without the tier (``replicas`` 0); true when no host is lost (a process restart)."""
    if not replicas:
        return False
    gone = set(lost)
    return all(any((host + j) % hosts not in gone for j in range(1, peer_copies(replicas, hosts) + 1))
               for host in gone)


def interval_steps(interval: float | int, step_s: float) -> int:
    """An interval in whole steps: as given in steps, else the duration's nearest count (at least one)."""
    if isinstance(interval, int):
        return interval
    return max(1, round(interval / step_s))
