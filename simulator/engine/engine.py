"""The SimPy engine: every rank's streams execute their ops in order; collectives run on the network model.

An op runs when its dependencies are done and its stream is free (on a serial stream: when no other op of it
runs, in the order the ops became ready, like a server thread draining a queue). A collective (or send/recv)
starts when the last member of its group arrives; its phases then run on the shared `Network`, so concurrent
collectives contend for links. A run that ends with ops left over is a deadlock, reported with the ranks and the op.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from operator import itemgetter

import simpy

from simulator.engine.contention import Contention
from simulator.engine.groups import GroupIds
from simulator.engine.lockstep import Lockstep, LockstepWatch, StoppedOutOfStep
from simulator.engine.plans import PlanCache
from simulator.engine.shapes import plan_key
from simulator.engine.sharing import Sharing
from simulator.engine.stepping import Steps, run_until, start, succeed_next
from simulator.errors import SimulationError
from simulator.metrics.events import COLLECTIVE_KIND, COMPUTE_KIND, EventLog, FlowBlock
from simulator.program.ops import CollectiveOp, ComputeOp, Op

PROGRESS_EVERY = 1024
"""Ops between two calls of the progress callback (a call costs about as much as an op), which hears the last op's
count too."""


def _terms(op: CollectiveOp) -> str:
    """What every member of a collective must agree on, in words (for the refusal of members that do not)."""
    return (f"{op.op} of {op.nbytes:.0f} B over {op.group} (algorithm {op.algorithm}, protocol {op.protocol}, "
            f"root {op.root})")


@dataclass
class _Rendezvous:
    """Members of one collective that have arrived so far (each rank's own op: a send and its receive carry
    different names and virtual stages), how many are expected (the group's members that have a program), the
    group's id, and the event that fires when it completes."""

    template: CollectiveOp
    group_id: int
    expected: int
    done: simpy.Event
    arrived: dict[int, CollectiveOp] = field(default_factory=dict)


@dataclass
class EngineResult:
    """What a run produced: the event log and the time the last op finished."""

    log: EventLog
    makespan_s: float
    ops_executed: int
    replayed_flows: int = 0
    sm_lost_s: dict[str, float] = field(default_factory=dict)
    lockstep: Lockstep = field(default_factory=Lockstep)
    """Whether a folded run's mirrors kept pace with their groups (engine/lockstep.py), filled in by the caller
    that knows the mirrors kept, or by the run's `LockstepWatch` where it stopped the run."""
    stopped_at_s: float | None = None
    """Where the run's `LockstepWatch` stopped it at its first instance out of step: when (the log then holds
    what happened before); None where every op ran."""


class Engine:
    """Executes per-rank op programs. ``run_plan`` (env, phases, key) is a generator of the events that run a
    collective's phases on the network, followed with ``yield from`` inside the collective's stepping generator
    (engine/stepping.py), ``run_plans`` (env, plans, key) the same for a collective with its mirrors; ``plans`` turns a
    collective op into phases (shared with the caller's analysis). Ops on ``async_streams`` do not queue behind each
    other: each runs as soon as its dependencies are done. Ops on ``serial_streams`` run one at a time in the order
    their dependencies were done (first ready, first run). ``compute_duration`` (rank, duration, now) -> seconds is the
    straggler hook: how long a kernel of nominal ``duration`` starting now takes on that rank. ``sharing`` says which
    mirrors each collective keeps and which collectives run alone on their links (engine/sharing.py). ``contention``
    (None: off) slows compute-bound kernels while communication kernels hold SMs on their GPU (engine/contention.py).
    ``watch`` (None: off) checks each collective with kept mirrors as it ends and may stop the run at the first
    whose mirrors fell out of step (engine/lockstep.py `LockstepWatch`). The run ends when the last op finishes,
    even if fault events are still scheduled later."""

    def __init__(self, env: simpy.Environment, plans: PlanCache, run_plan: Callable, run_plans: Callable,
                 log: EventLog, sharing: Sharing, async_streams: frozenset[str] = frozenset(),
                 serial_streams: frozenset[str] = frozenset(), isolated: Callable | None = None,
                 compute_duration: Callable[[int, float, float], float] | None = None,
                 progress: Callable[[int, int], None] | None = None, contention: Contention | None = None,
                 watch: LockstepWatch | None = None):
        self.env = env
        self.watch = watch
        self.contention = contention
        self.progress = progress
        self.compute_duration = compute_duration
        self.plans = plans
        self.run_plan = run_plan
        self.run_plans = run_plans
        self.log = log
        self.async_streams = async_streams
        self.serial_streams = serial_streams
        self.isolated = isolated
        self.sharing = sharing
        self._isolated_runs: dict[tuple, tuple[float, FlowBlock, int, int]] = {}
        self._planned_shapes: dict[tuple, tuple[tuple, list, int]] = {}
        self._alone = sharing.private if isolated is not None else frozenset()
        self._finished_ops: set[int] = set()
        self._awaited: dict[int, simpy.Event] = {}
        self._rendezvous: dict[str, _Rendezvous] = {}
        self._finished: set[str] = set()
        self._streams: list[tuple[tuple[int, str], list[Op], simpy.Resource | None]] = []
        """Each stream (rank, name), its ops and its turn; the deadlock report finds where one stopped (its first
        op not finished)."""
        self._present: frozenset[int] = frozenset()
        self._group_ids = GroupIds()
        self._pair_ids = GroupIds()
        """Dense ids of the pair-size matrices of uneven all-to-alls, found by object identity (`_shape_key`)."""
        self._group_members: dict[int, tuple[int, frozenset[int], int]] = {}
        self._group_facts_of: dict[int, tuple[tuple[int, ...], tuple[int, frozenset[int], int]]] = {}
        self._replayed_flows = 0
        self._total = 0
        self._all_done = env.event()
        self._running: dict[str | tuple[int, str], Steps] = {}
        """The stepping generators not finished yet, streams by (rank, name) and collectives by key, kept only in a
        watched run (``watch``): a run the watch stops closes them (`_drop_pending`)."""

    @property
    def executed(self) -> int:
        """How many ops have finished so far."""
        return len(self._finished_ops)

    def run(self, ops: Iterable[Op]) -> EngineResult:
        """Run every op to completion, or until the ``watch`` stops the run, and return the log; raise
        SimulationError on a deadlock."""
        streams: dict[tuple[int, str], list[Op]] = defaultdict(list)
        ops = list(ops)
        self._present = frozenset(op.rank for op in ops)
        ids: set[int] = set()  # checked here and dropped: a set of every op id is 134 MB at 3.47 M ops
        for op in ops:
            if op.id in ids:
                raise SimulationError(f"duplicate op id {op.id} ({op.name})")
            ids.add(op.id)
            streams[(op.rank, op.stream)].append(op)
        for op_list in streams.values():
            for op in op_list:
                if not ids.issuperset(op.deps):
                    missing = [dep for dep in op.deps if dep not in ids]
                    raise SimulationError(f"op {op.name!r} on rank {op.rank} depends on unknown op ids {missing}")
        del ids
        for (rank, stream), op_list in sorted(streams.items()):
            if stream in self.async_streams or stream in self.serial_streams:
                turn = simpy.Resource(self.env, capacity=1) if stream in self.serial_streams else None
                self._streams += [((rank, f"{stream}#{op.id}"), [op], turn) for op in op_list]
            else:
                self._streams.append(((rank, stream), op_list, None))
        self._total = len(ops)
        steps: dict[str | tuple[int, str], Steps] = {
            name: self._stream(*name, op_list, turn) for name, op_list, turn in self._streams}
        if self.watch is not None:
            self._running.update(steps)
        start(self.env, list(steps.values()))
        if not ops:
            self._all_done.succeed()
        try:
            run_until(self.env, self._all_done)
        except StoppedOutOfStep as stop:
            self._drop_pending()
            return EngineResult(self.log, self.env.now, self.executed, self._replayed_flows,
                                lockstep=stop.lockstep, stopped_at_s=self.env.now)
        if not self._all_done.triggered:  # no events left before every op finished
            raise SimulationError(self._deadlock_report())
        lost = dict(sorted(self.contention.lost_s.items())) if self.contention is not None else {}
        return EngineResult(self.log, self.env.now, self.executed, self._replayed_flows, lost)

    def _drop_pending(self) -> None:
        """Close a stopped run's stepping generators and drop its scheduled and awaited events. Each suspended
        generator holds the engine and is held by an event's callback that the engine reaches (its queue, a
        rendezvous, a flow on its network): cycles that the paused cyclic collector (simulator/collector.py)
        would keep, with the run's network and log, until the command ends."""
        for steps in self._running.values():
            steps.close()
        self._running.clear()
        self.env._queue.clear()
        self._rendezvous.clear()
        self._awaited.clear()

    def _stream(self, rank: int, stream: str, ops: list[Op], turn: simpy.Resource | None = None) -> Steps:
        """Run ``ops`` in order; with ``turn`` (one op of a serial stream) the op first waits for the stream to
        be free. An op is logged under its own stream's name, also where ``stream`` is one op's slice of an async
        or serial stream (`pp#17`). The clock is read as ``env._now``, SimPy's ``now`` without its property call
        (twice per op; engine/stepping.py reads SimPy's queue so too)."""
        env, log, finished, awaited = self.env, self.log, self._finished_ops, self._awaited
        contention, slowed, progress, total = self.contention, self.compute_duration, self.progress, self._total
        for op in ops:
            if not finished.issuperset(op.deps):
                waits = [self._completion(dep) for dep in op.deps if dep not in finished]
                yield waits[0] if len(waits) == 1 else env.all_of(waits)
            request = None
            if turn is not None:
                request = turn.request()
                yield request
            if isinstance(op, ComputeOp):
                start = env._now
                duration = op.duration
                if slowed is not None and duration > 0:
                    duration = slowed(rank, duration, start)
                if duration > 0:
                    if contention is None or op.sm_bound_share <= 0:
                        yield env.timeout(duration)
                    else:
                        kernel = contention.start(rank, duration, op.sm_bound_share, op.reserved_sms)
                        yield kernel.end
                        contention.finish(kernel)
                log.record(COMPUTE_KIND, rank, op.stream, op.name, op.category,
                           op.microbatch, op.chunk, start, env._now, op.hbm_bytes, op.flops)
            elif isinstance(op, CollectiveOp):
                yield self._join(op)
            else:
                raise SimulationError(f"op {op.name!r} has unsupported type {type(op).__name__}")
            if request is not None:
                request.resource.release(request)
            finished.add(op.id)
            waiting = awaited.pop(op.id, None)
            if waiting is not None:
                waiting.succeed()
            done = len(finished)
            if done == total:
                self._all_done.succeed()
                if progress is not None:  # the last count too: the bar drawn full, the plain line at 100%
                    progress(done, total)
            elif progress is not None and done % PROGRESS_EVERY == 0:
                progress(done, total)
        self._running.pop((rank, stream), None)

    def _completion(self, op_id: int) -> simpy.Event:
        """The event that fires when op ``op_id`` (not finished yet) finishes. Made only for the ops something
        waits for: most ops only precede the next op of their own stream, which runs after them anyway, and an
        event nobody waits on would still cost a trip through SimPy's queue (the order of the other events is
        the same either way)."""
        event = self._awaited.get(op_id)
        if event is None:
            event = self._awaited[op_id] = self.env.event()
        return event

    def _group_facts(self, group: tuple[int, ...]) -> tuple[int, frozenset[int], int]:
        """A group's id, member set and how many of its members have a program, worked out once per group
        value and found by the tuple object's identity (the ops of one group carry a few tuple objects among
        them, not one each; the cache keeps each referenced, so its id stays unique)."""
        known = self._group_facts_of.get(id(group))
        if known is None:
            group_id = self._group_ids.id(group)
            facts = self._group_members.get(group_id)
            if facts is None:
                members = frozenset(group)
                facts = self._group_members[group_id] = (group_id, members, len(members & self._present))
            known = self._group_facts_of[id(group)] = (group, facts)
        return known[1]

    def _join(self, op: CollectiveOp) -> simpy.Event:
        """Register ``op.rank`` as arrived; start the collective when the whole group is there. Each arrival
        costs O(1) whatever the group size: the group is identified and counted once. A private collective
        with a single simulated member (a folded rank's TP collectives) skips the rendezvous."""
        group_id, members, expected = self._group_facts(op.group)
        if expected == 1 and op.id in self._alone:
            if op.rank not in members or op.key in self._finished:
                raise self._refused(op)
            self._finished.add(op.key)
            return self._replay(op, group_id, (op,), self.env.event())
        meeting = self._rendezvous.get(op.key)
        if op.rank not in members or (meeting is None and op.key in self._finished):
            raise self._refused(op)
        if meeting is None:
            meeting = _Rendezvous(op, group_id, expected, self.env.event())
            self._rendezvous[op.key] = meeting
        template = meeting.template
        if (group_id != meeting.group_id or op.op != template.op or op.nbytes != template.nbytes
                or op.algorithm != template.algorithm or op.protocol != template.protocol
                or op.root != template.root):
            raise SimulationError(f"ranks disagree on {op.name!r} (key {op.key}): {_terms(template)} vs {_terms(op)}")
        if op.rank in meeting.arrived:
            raise SimulationError(f"rank {op.rank} joins {op.op} {op.name!r} (key {op.key}) twice")
        meeting.arrived[op.rank] = op
        if len(meeting.arrived) == meeting.expected:
            del self._rendezvous[op.key]
            self._finished.add(op.key)
            if template.id in self._alone:
                return self._replay(template, group_id, tuple(meeting.arrived.values()), meeting.done)
            steps = self._collective(meeting)
            if self.watch is not None:
                self._running[op.key] = steps
            start(self.env, [steps])
        return meeting.done

    def _refused(self, op: CollectiveOp) -> SimulationError:
        """Why ``op`` cannot join: its rank is not in the group (whether or not the collective has finished), or
        its collective has finished already."""
        if op.rank not in self._group_facts(op.group)[1]:
            return SimulationError(f"rank {op.rank} joins {op.op} {op.name!r} but is not in its group {op.group}")
        return SimulationError(f"rank {op.rank} joins {op.op} {op.name!r} (key {op.key}) after it finished")

    def _collective(self, meeting: _Rendezvous) -> Steps:
        """Run the collective's phases, and those of its mirrors (the same collective of folded replicas,
        which share the fabric with it), all at once; then log its row for every member that took part,
        release the SMs it held and release the members."""
        op = meeting.template
        start = self.env.now
        mirrors = self.sharing.mirrors_of(op)
        plans, sms = self._planned(op, meeting.group_id, mirrors)
        if sms:
            self._hold(meeting.arrived, op.category, sms)
        watch = self.watch
        if mirrors and watch is not None and watch.watching:
            ends: list[float | None] = []
            yield from self.run_plans(self.env, plans, op.key, ends)
            watch.ended(meeting.arrived, mirrors, ends, self.env.now)
        elif mirrors:
            yield from self.run_plans(self.env, plans, op.key)
        else:
            yield from self.run_plan(self.env, plans[0], op.key)
        if sms:
            self._release(meeting.arrived, op.category, sms)
        self._record(meeting.arrived.values(), start)
        self._running.pop(op.key, None)
        meeting.done.succeed()

    def _planned(self, op: CollectiveOp, group_id: int, mirrors: tuple[tuple[int, ...], ...]) -> tuple[list, int]:
        """The plans of ``op`` over its group and each of its kept ``mirrors`` (one list of plans, the same
        object for every instance, which the plan runner keys its batches by), and the SMs its kernel holds
        (0: none, or an empty plan, which takes no time), worked out once per shape: named by the group's id,
        since the ops of one group often carry tuples of their own, and by the mirrors' identity (the sharing
        analysis gives one tuple per shape)."""
        shape = (self._shape_key(op, group_id), op.sms, id(mirrors))
        known = self._planned_shapes.get(shape)
        if known is None:
            plans = self.plans.mirrored_phases(op, mirrors) if mirrors else [self.plans.phases(op, op.group)]
            sms = self._kernel_sms(op, any(plans))
            known = self._planned_shapes[shape] = (mirrors, plans, sms)
        return known[1], known[2]

    def _shape_key(self, op: CollectiveOp, group_id: int) -> tuple:
        """`plan_key` of ``op`` with its group and pair sizes named by dense ids: an uneven all-to-all's ep x ep
        pair sizes are hashed once per tuple object, not by value per meeting; an op without pair sizes (all but
        an uneven all-to-all) is keyed -1 without a lookup, as `CollectiveShapes.of` keys it."""
        return plan_key(op, group_id, self._pair_ids.id(op.pair_bytes) if op.pair_bytes else -1)

    def _kernel_sms(self, op: CollectiveOp, takes_time: bool) -> int:
        """The SMs ``op``'s kernel holds on each member GPU: 0 with contention off or where the collective takes
        no time, so that a nonzero count is what says to `hold` and `release` them."""
        if self.contention is None or not takes_time:
            return 0
        return max(self.contention.kernel_sms(op), 0)

    def _hold(self, ranks: Iterable[int], category: str, sms: int) -> None:
        """Hold ``sms`` SMs on each of ``ranks`` for a collective kernel (a count from `_kernel_sms`, nonzero only
        with contention on)."""
        assert self.contention is not None
        self.contention.hold(ranks, category, sms)

    def _release(self, ranks: Iterable[int], category: str, sms: int) -> None:
        """Give back the SMs `_hold` took."""
        assert self.contention is not None
        self.contention.release(ranks, category, sms)

    def _record(self, members: Iterable[CollectiveOp], start: float) -> None:
        """Log a finished collective's row for each member, under the member's own op (its name, stream and
        virtual stage: a pipeline send is logged on the sender as the send, not as its receive)."""
        record, end = self.log.record, self.env._now
        for op in members:
            record(COLLECTIVE_KIND, op.rank, op.stream, op.name, op.category, op.microbatch, op.chunk, start, end,
                   op.nbytes, 0.0, op.key)

    def _replay(self, op: CollectiveOp, group_id: int, members: tuple[CollectiveOp, ...],
                done: simpy.Event) -> simpy.Event:
        """A private collective: time its plan once on an idle network, then replay that run's duration and
        flow rows (shifted to its start) for every identical instance. Nothing is started for it: a timeout's
        callback logs the rows and releases the members (``done``, returned; most collectives of a folded step
        are private, so this saves a collective's stepping generator and its urgent start per instance)."""
        shape = (self._shape_key(op, group_id), op.sms)
        run = self._isolated_runs.get(shape)
        if run is None:
            assert self.isolated is not None
            duration, flows = self.isolated(self.plans.phases(op, op.group))
            sms = self._kernel_sms(op, duration > 0)
            run = self._isolated_runs[shape] = (duration, flows, len(flows), sms)
        duration, flows, rows, sms = run
        self._replayed_flows += rows
        if duration > 0:
            if sms:
                self._hold((member.rank for member in members), op.category, sms)
            self.env.timeout(duration).callbacks.append(
                partial(self._replay_ended, op, members, done, flows, self.env._now, sms))
        else:
            self._log_replay(op, members, flows, self.env._now, 0)
            done.succeed()
        return done

    def _replay_ended(self, op: CollectiveOp, members: tuple[CollectiveOp, ...], done: simpy.Event,
                      flows: FlowBlock, start: float, sms: int, _timeout: simpy.Event) -> None:
        """The only callback of the timeout that ends a replayed collective: log it and release its members,
        at once when nothing else is due now (`succeed_next`)."""
        self._log_replay(op, members, flows, start, sms)
        succeed_next(self.env, done)

    def _log_replay(self, op: CollectiveOp, members: tuple[CollectiveOp, ...], flows: FlowBlock, start: float,
                    sms: int) -> None:
        """Log the replayed collective's flows and rows and release the ``sms`` SMs its kernel held (0: none, or
        no contention)."""
        self.log.replayed_flows(op.key, start, flows)
        if sms:
            self._release((member.rank for member in members), op.category, sms)
        self._record(members, start)

    def _deadlock_report(self) -> str:
        """The collectives still waiting (op, key, the simulated ranks missing and those arrived), or else the
        blocked streams (each stream's first op not finished, and those of its dependencies not finished); at
        most eight of either."""
        lines = []
        for key, meeting in sorted(self._rendezvous.items())[:8]:
            op = meeting.template
            missing = [rank for rank in op.group if rank in self._present and rank not in meeting.arrived]
            lines.append(f"collective {op.name!r} ({op.op}, key {key}) waits for ranks {missing}; "
                         f"arrived: {sorted(meeting.arrived)}")
        if len(self._rendezvous) > 8:
            lines.append(f"and {len(self._rendezvous) - 8} more collectives")
        if not lines:
            finished = self._finished_ops
            blocked_at = ((slot, next(op for op in ops if op.id not in finished))
                          for slot, ops, _turn in sorted(self._streams, key=itemgetter(0))
                          if not finished.issuperset(op.id for op in ops))
            for (rank, stream), blocked in islice(blocked_at, 8):
                waits = [dep for dep in blocked.deps if dep not in finished]
                lines.append(f"rank {rank} stream {stream!r} blocked at {blocked.name!r} (waits for ops {waits})")
        return "deadlock: " + "; ".join(lines)
