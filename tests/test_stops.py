"""A Ctrl-C or SIGTERM that Python dropped where it landed (simulator/stops.py): kept by the console script's
unraisable hook, raised once at the next safe point (at the latest as the command returns); every other unraisable
exception goes to the hook before; a forked child starts with none."""

from __future__ import annotations

import os
import threading
from contextlib import suppress
from types import SimpleNamespace

import pytest

from simulator import stops
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
    assert not stops._DROPPED, "a stop kept past a failed command"


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


def test_a_stop_no_safe_point_met_is_raised_as_the_command_returns_and_none_outlives_main(tmp_path, capsys):
    """`main` raises a stop kept to the end of its command (`collective`, `validate-published`, or one dropped
    after a run's last safe point): `interrupted`, 130, where the command had returned 0 without a word. One
    kept when the command fails otherwise is dropped with it, not left for the next in-process call."""
    from simulator.cli import main

    kept_for_later(print, SimpleNamespace(exc_value=KeyboardInterrupt()))
    assert main(["scenarios"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {name: no-such-model}\n")
    kept_for_later(print, SimpleNamespace(exc_value=KeyboardInterrupt()))
    assert main(["run", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert not stops._DROPPED, "a stop kept past a failed command"


def test_a_forked_child_starts_with_no_stop_kept():
    """A stop is raised only in the process it came to: a worker forked while one is kept (a sweep's pool with
    point outputs reaches a run folder's safe point) does not raise it too."""
    kept_for_later(print, SimpleNamespace(exc_value=KeyboardInterrupt()))
    try:
        child = os.fork()
        if child == 0:
            try:
                raise_dropped()
            except KeyboardInterrupt:
                os._exit(1)
            os._exit(0)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    finally:
        with suppress(KeyboardInterrupt):  # the parent's own, left kept
            raise_dropped()


def test_the_cli_imports_where_python_has_no_fork_hooks():
    """`os.register_at_fork` exists only where processes fork (not on Windows): the hook is set only there, as
    console/progress.py's is, so importing the command line does not fail on an AttributeError."""
    import subprocess
    import sys

    code = "import os; del os.register_at_fork; import simulator.cli"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

