"""Generators run on SimPy events without SimPy processes.

The engine runs some 100,000 short sequences of steps per large step program (a stream's ops, a collective's
phases). As SimPy processes each would pay for a start event, an end event nobody waits for, and the process's
bookkeeping at every resumption. Here a generator is resumed straight from the callbacks of the events it
yields, and started by an urgent event, as a process is: every other event is scheduled at the same point, so
the run processes the events it shares with a process-based run in the same order, and its results are the
same to the last bit. An event that failed is thrown into the generator waiting on it, as SimPy does for a
process (the event is defused: the generator handles the error); an error the generator does not catch
propagates, as itself, from the step that resumed it. `run_until` is SimPy's event loop without a method call per event.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from contextlib import suppress
from heapq import heappop
from types import MemberDescriptorType

import simpy
from simpy.events import PENDING, URGENT

from simulator.errors import InputError

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
    about a quarter of a million. A failed event that nothing defused raises, as in SimPy, a copy of its exception
    (`copied`) whose cause is the original. It reads SimPy's private queue and event fields, as 4.1 lays them out (the
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
            error = event._value
            copy = copied(error)
            copy.__cause__ = error
            raise copy
        if event is until:
            return


def copied(error: BaseException) -> BaseException:
    """A copy of ``error`` with all its parts: an `InputError` rebuilt (`InputError.rebuilt`, its location
    whole); any other made without calling its ``__init__`` again, then given the original's args, the fields
    a built-in base keeps outside them (`_builtin_fields`) and its attributes. SimPy's copy,
    ``type(error)(*error.args)``, gave an InputError its rendered line as its problem and dropped its field
    and flag; it fails for an error whose ``__init__`` takes other arguments, doubles a message that
    ``__init__`` formats (``bad value bad value 5``), and an ``__init__`` that reads its argument's parts fails on
    the rendered string, its error replacing the original. Made without ``__init__`` and without the built-in
    fields, a UnicodeDecodeError or an OSError subclass with its own ``__init__`` came out empty (``str`` '',
    no errno nor filename)."""
    if isinstance(error, InputError):
        return error.rebuilt()
    kind = type(error)
    copy = kind.__new__(kind, *error.args)
    copy.args = error.args  # an OSError subclass with its own __init__ leaves them to it
    for name in _builtin_fields(kind):
        value = getattr(error, name, None)
        if value is not None:  # an OSError given None for its filename2 would print '-> None'
            with suppress(AttributeError):  # read-only: an ExceptionGroup's, which its __new__ sets
                setattr(copy, name, value)
    copy.__dict__.update(vars(error))
    return copy


def _builtin_fields(kind: type[BaseException]) -> list[str]:
    """The public fields the built-in exception classes of ``kind``'s bases keep in C, set by their
    ``__init__`` (an OSError's errno, strerror and filename; a UnicodeDecodeError's encoding, object and
    reason; SystemExit's code): not in the instance's ``__dict__``, and an OSError's filename not in its args
    either."""
    return [name for base in kind.__mro__ if base.__module__ == "builtins"
            for name, field in vars(base).items()
            if isinstance(field, MemberDescriptorType) and not name.startswith("_")]
