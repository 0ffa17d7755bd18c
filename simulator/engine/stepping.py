"""Generators run on SimPy events without SimPy processes.

The engine runs some 100,000 short sequences of steps per large step program (a stream's ops, a collective's
phases). As SimPy processes each would pay for a start event, an end event nobody waits for, and the process's
bookkeeping at every resumption. Here a generator is resumed straight from the callbacks of the events it
yields, and started by an urgent event, as a process is: every other event is scheduled at the same point, so
the run processes the events it shares with a process-based run in the same order, and its results are the
same to the last bit. An event that failed is thrown into the generator waiting on it, as SimPy does for a
process (the event is defused: the generator handles the error); an error the generator does not catch
propagates, as itself, from the step that resumed it. `run_until` is SimPy's event loop without a method call per event;
`run_all` runs a nested loop (a plan timed alone, a job's replication) on it, so its errors come out as themselves too.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from heapq import heappop

import simpy
from simpy.events import PENDING, URGENT

Steps = Generator[simpy.Event, None, None]
"""A generator that yields the events it waits for (the values they carry are not sent in)."""


class Urgent(simpy.Event):
    """An event that calls ``callback`` at the current time before the ordinary events due then, in the order
    such events were scheduled (as SimPy starts a process or delivers an interrupt)."""

    def __init__(self, env: simpy.Environment, callback: Callable[[simpy.Event], None]):
        super().__init__(env)
        self._ok = True
        self._value = None
        self.callbacks.append(callback)
        env.schedule(self, URGENT)


def follow(steps: Steps) -> None:
    """Run ``steps`` now up to the first event it yields that has not been processed yet, and from that event's
    callbacks on to the next, until it ends. A failed event's exception is raised at the ``yield`` that waited
    for it; the exception object itself, so an `InputError` keeps its field."""

    def resume(event: simpy.Event | None = None) -> None:
        try:
            while True:
                if event is None or event._ok:
                    event = next(steps)
                else:
                    event._defused = True
                    event = steps.throw(event._value)
                callbacks = event.callbacks
                if callbacks is not None:
                    callbacks.append(resume)
                    return
        except StopIteration:
            return

    resume()


def succeed_next(env: simpy.Environment, event: simpy.Event) -> None:
    """Succeed ``event`` as the last act of the only callback of the event being processed. Scheduled, it would
    be processed next unless some other event is due at this instant (all such were scheduled before it, or are
    urgent); in that case its callbacks run at once, which saves its trip through the queue and changes nothing
    else, and otherwise it is scheduled. ``event`` must be pending (neither triggered nor scheduled)."""
    assert event._value is PENDING, "succeed_next of an event already triggered"
    queue = env._queue
    if queue and queue[0][0] <= env._now:
        event.succeed()
        return
    event._ok, event._value = True, None
    callbacks = event.callbacks
    event.callbacks = None  # type: ignore[assignment]  # processed, as SimPy marks it
    for callback in callbacks:
        callback(event)


def start(env: simpy.Environment, runs: Iterable[Steps]) -> None:
    """Start ``runs`` in their order with one urgent event, where SimPy would start a process for each: the
    events they schedule come out in the same order."""
    runs = list(runs)

    def begin(_event: simpy.Event) -> None:
        for steps in runs:
            follow(steps)

    Urgent(env, begin)


def run_until(env: simpy.Environment, until: simpy.Event) -> None:
    """Process ``env``'s events in SimPy's order until ``until`` has been processed, or none are left (then
    ``until`` has not been: the caller says why). ``until`` must be an event not processed yet that never fails
    and that nothing else waits on (no callbacks): for such an event this is `simpy.Environment.run(until)` with
    SimPy's `step` inlined, one method call and one exception frame less per event, of which a training step has
    about a quarter of a million. A failed event that nothing defused raises its exception itself, where SimPy raises
    ``type(error)(*error.args)``, a copy that loses what ``__init__`` does not rebuild from its args (an
    InputError's field and location). It reads SimPy's private queue and event fields, as 4.1 lays them out (the
    version pyproject.toml pins; tests/test_stepping.py runs it against `env.run`)."""
    assert until.callbacks == [], "run_until needs an event not processed yet that nobody waits on"
    queue = env._queue
    while queue:
        env._now, _, _, event = heappop(queue)
        callbacks = event.callbacks
        event.callbacks = None  # type: ignore[assignment]  # processed, as SimPy marks it
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            raise event._value
        if event is until:
            return



def run_all(env: simpy.Environment) -> None:
    """Process all of ``env``'s events, as `simpy.Environment.run()` does, but an error that fails the run comes out
    as itself (with its field, location or filename) rather than as SimPy's copy made of its args."""
    run_until(env, env.event())
