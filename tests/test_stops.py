"""A Ctrl-C or SIGTERM that Python dropped where it landed (simulator/stops.py): kept by the console script's
unraisable hook, raised once at the next safe point; every other unraisable exception goes to the hook before."""

from __future__ import annotations

import threading
from contextlib import suppress
from types import SimpleNamespace

import pytest

from simulator.errors import Terminated
from simulator.stops import kept_for_later, raise_dropped


def test_a_dropped_stop_is_kept_and_raised_once():
    handed = []
    first, second = Terminated(), KeyboardInterrupt()
    kept_for_later(handed.append, SimpleNamespace(exc_value=first))
    kept_for_later(handed.append, SimpleNamespace(exc_value=second))  # the handler ignores later stops anyway
    with pytest.raises(Terminated) as raised:
        raise_dropped()
    assert raised.value is first and handed == []
    raise_dropped()  # nothing kept any more


def test_other_unraisable_exceptions_and_other_threads_stops_go_to_the_hook_before():
    handed: list = []
    error = SimpleNamespace(exc_value=ValueError("in a __del__"))
    kept_for_later(handed.append, error)
    elsewhere = SimpleNamespace(exc_value=KeyboardInterrupt())
    thread = threading.Thread(target=kept_for_later, args=(handed.append, elsewhere))
    thread.start()
    thread.join()
    assert handed == [error, elsewhere]
    raise_dropped()


def test_a_runs_progress_report_raises_a_dropped_stop():
    """Each report of a run's progress is a safe point: the engine's every PROGRESS_EVERY ops, with --quiet too."""
    from simulator.console.progress import RunProgress

    kept_for_later(print, SimpleNamespace(exc_value=KeyboardInterrupt()))
    try:
        with RunProgress(enabled=False) as progress, pytest.raises(KeyboardInterrupt):
            progress(1024, 2048)
    finally:
        with suppress(KeyboardInterrupt):  # left kept where the report did not raise it
            raise_dropped()
