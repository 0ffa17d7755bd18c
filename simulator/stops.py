"""Ctrl-C and SIGTERM that Python dropped where they landed, raised again at the run's next safe point.

The console script's handler (cli.py `_interrupted_once`) raises KeyboardInterrupt (`Terminated` for SIGTERM)
wherever the main thread is when the signal comes, and ignores every later stop. Where that is code run at
deallocation (a weakref callback: the entry of a step's program order in simulation.py's `_SHARING` as
`simulate()` returns, the topology's in collectives/tuner.py; a ``__del__``; a dropped generator's cleanup) or
a fork hook, Python cannot raise it: it printed it as 'Exception ignored', with a traceback, and dropped it,
and the run went on to write its outputs and exit 0. `kept_for_later`, the console script's
`sys.unraisablehook`, keeps such a stop instead and prints nothing; `raise_dropped` raises it at the run's
safe points: each progress report (`RunProgress`: the engine's every `PROGRESS_EVERY` ops and its last, a
job's or a study's phases, 'writing outputs'), the moment before a run's files move into their folder
(report/run_folder.py) and each point a sweep or a search finishes (sweep/runner.py, sweep/search.py), so a
dropped stop still ends the run with nothing half-written. One that no safe point met (a command with none,
as `collective` and `validate-published`, or one dropped after the last) is raised by `cli.main` as the
command returns: its outputs are then in place, whole. The hook cannot raise the stop anew itself: Python
looks for signals at the hook's own calls, so a signal raised from it landed in the hook, where Python drops
an exception as well. A forked child starts with none kept: a stop is raised only in the process it came
to."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

_DROPPED: list[KeyboardInterrupt] = []
"""The stop Python dropped that no safe point has raised yet (one at most: the handler ignores later ones)."""


def kept_for_later(previous: Callable[[sys.UnraisableHookArgs], object], unraisable: sys.UnraisableHookArgs) -> None:
    """`sys.unraisablehook` for the console script: a KeyboardInterrupt dropped in the main thread kept for
    `raise_dropped`; anything else handed to ``previous``, the hook it replaced."""
    stop = unraisable.exc_value
    if not isinstance(stop, KeyboardInterrupt) or threading.current_thread() is not threading.main_thread():
        previous(unraisable)
        return
    if not _DROPPED:
        _DROPPED.append(stop)


def raise_dropped() -> None:
    """Raise the stop Python dropped, if one is kept (once)."""
    if _DROPPED:
        raise _DROPPED.pop().with_traceback(None)


def forget_dropped() -> None:
    """Drop the kept stop, if any: `cli.main` as it ends and a forked child as it starts, so that none outlives
    the command, or leaves the process, that received it."""
    _DROPPED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_dropped)
