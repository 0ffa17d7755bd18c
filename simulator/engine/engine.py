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

import simpy

from simulator.engine.contention import Contention
from simulator.engine.groups import GroupIds
from simulator.engine.plans import PlanCache
from simulator.engine.sharing import Sharing
from simulator.engine.stepping import Steps, start
from simulator.errors import InputError, SimulationError
from simulator.metrics.events import EventLog, FlowBlock
from simulator.program.ops import CollectiveOp, ComputeOp, Op

PROGRESS_EVERY = 1024
"""Ops between two calls of the progress callback (a call costs about as much as an op)."""


@dataclass
class _Rendezvous:
    """Members of one collective that have arrived so far, how many are expected (the group's members that
    have a program), the group's id, and the event that fires when it completes."""

    template: CollectiveOp
    group_id: int
    expected: int
    done: simpy.Event
    arrived: dict[int, float] = field(default_factory=dict)


@dataclass
class EngineResult:
    """What a run produced: the event log and the time the last op finished."""

    log: EventLog
    makespan_s: float
    ops_executed: int
    replayed_flows: int = 0
    sm_lost_s: dict[str, float] = field(default_factory=dict)


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
    The run ends when the last op finishes, even if fault events are still scheduled later."""

    def __init__(self, env: simpy.Environment, plans: PlanCache, run_plan: Callable, run_plans: Callable,
                 log: EventLog, sharing: Sharing, async_streams: frozenset[str] = frozenset(),
                 serial_streams: frozenset[str] = frozenset(), isolated: Callable | None = None,
                 compute_duration: Callable[[int, float, float], float] | None = None,
                 progress: Callable[[int, int], None] | None = None, contention: Contention | None = None):
        self.env = env
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
        self._isolated_runs: dict[tuple, tuple[float, FlowBlock]] = {}
        self._ids: set[int] = set()
        self._finished_ops: set[int] = set()
        self._awaited: dict[int, simpy.Event] = {}
        self._rendezvous: dict[str, _Rendezvous] = {}
        self._finished: set[str] = set()
        self._pending: dict[tuple[int, str], Op] = {}
        self._present: frozenset[int] = frozenset()
        self._group_ids = GroupIds()
        self._group_members: dict[int, tuple[int, frozenset[int], int]] = {}
        self._group_facts_of: dict[int, tuple[tuple[int, ...], tuple[int, frozenset[int], int]]] = {}
        self._executed = 0
        self._replayed_flows = 0
        self._left = 0
        self._all_done = env.event()

    def run(self, ops: Iterable[Op]) -> EngineResult:
        """Run every op to completion and return the log; raise SimulationError on a deadlock."""
        streams: dict[tuple[int, str], list[Op]] = defaultdict(list)
        ops = list(ops)
        self._present = frozenset(op.rank for op in ops)
        for op in ops:
            if op.id in self._ids:
                raise SimulationError(f"duplicate op id {op.id} ({op.name})")
            self._ids.add(op.id)
            streams[(op.rank, op.stream)].append(op)
        for op_list in streams.values():
            for op in op_list:
                missing = [dep for dep in op.deps if dep not in self._ids]
                if missing:
                    raise SimulationError(f"op {op.name!r} on rank {op.rank} depends on unknown op ids {missing}")
        runs = []
        for (rank, stream), op_list in sorted(streams.items()):
            if stream in self.async_streams:
                runs += [self._stream(rank, f"{stream}#{op.id}", [op]) for op in op_list]
            elif stream in self.serial_streams:
                turn = simpy.Resource(self.env, capacity=1)
                runs += [self._stream(rank, f"{stream}#{op.id}", [op], turn) for op in op_list]
            else:
                runs.append(self._stream(rank, stream, op_list))
        start(self.env, runs)
        self._left = len(ops)
        if not ops:
            self._all_done.succeed()
        try:
            self.env.run(until=self._all_done)
        # A SimPy process (a plan of a collective with mirrors, a fault) that waits on a failed event gets a
        # copy of its error made from the args alone, without the field; the original is the copy's cause.
        except InputError as exc:
            if isinstance(exc.__cause__, InputError):
                raise exc.__cause__ from None
            raise
        except RuntimeError:  # SimPy: no events left before every op finished
            if self._all_done.triggered:
                raise
        if self._pending or not self._all_done.triggered:
            raise SimulationError(self._deadlock_report())
        lost = dict(sorted(self.contention.lost_s.items())) if self.contention is not None else {}
        return EngineResult(self.log, self.env.now, self._executed, self._replayed_flows, lost)

    def _stream(self, rank: int, stream: str, ops: list[Op], turn: simpy.Resource | None = None) -> Steps:
        """Run ``ops`` in order; with ``turn`` (one op of a serial stream) the op first waits for the stream to
        be free, and is logged under the stream's own name."""
        env, log, pending, finished, contention = self.env, self.log, self._pending, self._finished_ops, self.contention
        slot = (rank, stream)
        for op in ops:
            pending[slot] = op
            waits = [self._completion(dep) for dep in op.deps if dep not in finished]
            if len(waits) == 1:
                yield waits[0]
            elif waits:
                yield env.all_of(waits)
            request = None
            if turn is not None:
                request = turn.request()
                yield request
            if isinstance(op, ComputeOp):
                start = env.now
                duration = op.duration
                if self.compute_duration is not None and duration > 0:
                    duration = self.compute_duration(rank, duration, start)
                if duration > 0:
                    if contention is None or op.sm_bound_share <= 0:
                        yield env.timeout(duration)
                    else:
                        yield contention.run(rank, duration, op.sm_bound_share, op.reserved_sms)
                log.record("compute", rank, stream if turn is None else op.stream, op.name, start, env.now,
                           category=op.category, nbytes=op.hbm_bytes, flops=op.flops, microbatch=op.microbatch,
                           chunk=op.chunk)
            elif isinstance(op, CollectiveOp):
                yield self._join(op)
            else:
                raise SimulationError(f"op {op.name!r} has unsupported type {type(op).__name__}")
            if request is not None:
                request.resource.release(request)
            del pending[slot]
            self._executed += 1
            finished.add(op.id)
            awaited = self._awaited.pop(op.id, None)
            if awaited is not None:
                awaited.succeed()
            self._left -= 1
            if not self._left:
                self._all_done.succeed()
            if self.progress is not None and self._executed % PROGRESS_EVERY == 0:
                self.progress(self._executed, self._executed + self._left)

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
        object (the ops of one group share their tuple; the cache keeps it referenced, so its id stays unique)."""
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
        if expected == 1 and self.isolated is not None and op.id in self.sharing.private:
            if op.rank not in members or op.key in self._finished:
                raise self._refused(op)
            self._finished.add(op.key)
            done = self.env.event()
            self._replay(op, (op.rank,), done)
            return done
        meeting = self._rendezvous.get(op.key)
        if op.rank not in members or (meeting is None and op.key in self._finished):
            raise self._refused(op)
        if meeting is None:
            meeting = _Rendezvous(op, group_id, expected, self.env.event())
            self._rendezvous[op.key] = meeting
        template = meeting.template
        if group_id != meeting.group_id or op.op != template.op or op.nbytes != template.nbytes:
            raise SimulationError(f"ranks disagree on {op.name!r} (key {op.key}): {template.op} of "
                                  f"{template.nbytes:.0f} B over {template.group} vs {op.op} of {op.nbytes:.0f} B "
                                  f"over {op.group}")
        if op.rank in meeting.arrived:
            raise SimulationError(f"rank {op.rank} joins {op.op} {op.name!r} (key {op.key}) twice")
        meeting.arrived[op.rank] = self.env.now
        if len(meeting.arrived) == meeting.expected:
            del self._rendezvous[op.key]
            self._finished.add(op.key)
            if self.isolated is not None and template.id in self.sharing.private:
                self._replay(template, tuple(meeting.arrived), meeting.done)
            else:
                start(self.env, [self._collective(meeting)])
        return meeting.done

    def _refused(self, op: CollectiveOp) -> SimulationError:
        """Why ``op`` cannot join: its rank is not in the group (whether or not the collective has finished), or
        its collective has finished already."""
        if op.rank not in self._group_facts(op.group)[1]:
            return SimulationError(f"rank {op.rank} joins {op.op} {op.name!r} but is not in its group {op.group}")
        return SimulationError(f"rank {op.rank} joins {op.op} {op.name!r} (key {op.key}) after it finished")

    def _collective(self, meeting: _Rendezvous) -> Steps:
        """Run the collective's phases, and those of its mirrors (the same collective of folded replicas,
        which share the fabric with it), all at once."""
        op = meeting.template
        start = self.env.now
        mirrors = self.sharing.mirrors_of(op)
        plans = self.plans.mirrored_phases(op, mirrors) if mirrors else [self.plans.phases(op, op.group)]
        contention = self.contention if any(plans) else None  # an empty plan takes no time and holds no SMs
        if contention is not None:
            contention.hold(op, meeting.arrived, 1)
        if mirrors:
            yield from self.run_plans(self.env, plans, op.key)
        else:
            yield from self.run_plan(self.env, plans[0], op.key)
        self._finish(meeting, start, contention)

    def _finish(self, meeting: _Rendezvous, start: float, contention: Contention | None) -> None:
        """Log the collective's row for every member that took part, release the SMs it held in ``contention``,
        and release the members."""
        if contention is not None:
            contention.hold(meeting.template, meeting.arrived, -1)
        self._record(meeting.template, meeting.arrived, start)
        meeting.done.succeed()

    def _record(self, op: CollectiveOp, ranks: Iterable[int], start: float) -> None:
        for rank in ranks:
            self.log.record("collective", rank, op.stream, op.name, start, self.env.now, category=op.category,
                            nbytes=op.nbytes, key=op.key, microbatch=op.microbatch, chunk=op.chunk)

    def _replay(self, op: CollectiveOp, ranks: tuple[int, ...], done: simpy.Event) -> None:
        """A private collective: time its plan once on an idle network, then replay that run's duration and
        flow rows (shifted to its start) for every identical instance. Nothing is started for it: a timeout's
        callback logs the rows and releases the members (``done``; most collectives of a folded step are
        private, so this saves a collective's stepping generator and its urgent start per instance)."""
        shape = PlanCache.key(op, self._group_facts(op.group)[0])
        run = self._isolated_runs.get(shape)
        if run is None:
            assert self.isolated is not None
            run = self._isolated_runs[shape] = self.isolated(self.plans.phases(op, op.group))
        duration, flows = run
        self._replayed_flows += len(flows)
        start = self.env.now
        if duration > 0:
            contention = self.contention
            if contention is not None:
                contention.hold(op, ranks, 1)
            self.env.timeout(duration).callbacks.append(
                lambda _event: self._replayed(op, ranks, done, flows, start, contention))
        else:
            self._replayed(op, ranks, done, flows, start, None)

    def _replayed(self, op: CollectiveOp, ranks: tuple[int, ...], done: simpy.Event, flows: FlowBlock,
                  start: float, contention: Contention | None) -> None:
        """Log the replayed collective's flows and rows, release the SMs it held in ``contention`` (None for a
        collective of no duration, which held none) and its members."""
        self.log.replayed_flows(op.key, start, flows)
        if contention is not None:
            contention.hold(op, ranks, -1)
        self._record(op, ranks, start)
        done.succeed()

    def _deadlock_report(self) -> str:
        """The collectives still waiting (op, key, the simulated ranks missing and those arrived), or else the
        blocked streams; at most eight of either."""
        lines = []
        for key, meeting in sorted(self._rendezvous.items())[:8]:
            op = meeting.template
            missing = [rank for rank in op.group if rank in self._present and rank not in meeting.arrived]
            lines.append(f"collective {op.name!r} ({op.op}, key {key}) waits for ranks {missing}; "
                         f"arrived: {sorted(meeting.arrived)}")
        if len(self._rendezvous) > 8:
            lines.append(f"and {len(self._rendezvous) - 8} more collectives")
        if not lines:
            for (rank, stream), blocked in sorted(self._pending.items())[:8]:
                lines.append(f"rank {rank} stream {stream!r} blocked at {blocked.name!r} (waits for ops "
                             f"{list(blocked.deps)})")
        return "deadlock: " + "; ".join(lines)
