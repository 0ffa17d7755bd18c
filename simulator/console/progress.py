"""Progress of a long run on stderr, unless the user asked for --quiet: on a terminal a rich bar for runs longer
than a second; off one (a pipe, a log file, a batch job's output) a plain line every PLAIN_EVERY_S seconds, so
that a job of minutes shows it is alive without filling a log with a bar's redraws (nor importing rich's
progress module). Before, off a terminal a job printed nothing until its end. Both say what the run is doing
between counts (the cluster state a job's replication is simulating), and off a terminal a heartbeat thread
keeps the plain line coming while no count arrives: a 2,048-GPU job's first replication spent minutes
simulating its degraded leaf states with nothing printed."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from simulator.errors import STOP_SIGNALS

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

SHOW_AFTER_S = 1.0
"""A run that finishes within this many seconds never shows the bar."""
PLAIN_EVERY_S = 10.0
"""Off a terminal, a progress line at most this often, the first this long after the start (a run shorter than
this prints none)."""
BEAT_S = 1.0
"""How often the heartbeat thread looks whether a plain line is due: lines come at most this much later than
PLAIN_EVERY_S apart while a run is busy between counts."""


class PlainProgress:
    """Progress off a terminal: `DESCRIPTION: DONE/TOTAL UNIT (P%), DOING, H:MM:SS elapsed` on stderr, at most
    every PLAIN_EVERY_S seconds of ``clock``; callable as ``progress(done, total)`` for one ``unit`` and
    ``description``, or `show` for others (a job's phases); `doing` names what the run does between counts and
    `beat` prints the last line anew once it is due (the heartbeat, `start_heartbeat`)."""

    def __init__(self, unit: str = "ops", description: str = "simulating",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.unit = unit
        self.description = description
        self.clock = clock
        self.started = self.last = clock()
        self.counts: tuple[int, int, str, str] | None = None
        """The last count shown: done, total, unit, description."""
        self.activity = ""
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __call__(self, done: int, total: int) -> None:
        self.show(done, total, self.unit, self.description)

    def show(self, done: int, total: int, unit: str, description: str) -> None:
        self.counts = done, total, unit, description
        self.beat()

    def doing(self, activity: str) -> None:
        """What the run does now, said on each line until the next ``activity`` ('' for nothing more than the
        counts)."""
        self.activity = activity
        self.beat()

    def beat(self) -> None:
        """The progress line, if PLAIN_EVERY_S seconds have passed since the last (or the start)."""
        with self._lock:
            now = self.clock()
            if now - self.last < PLAIN_EVERY_S:
                return
            self.last = now
            parts = [self.activity] if self.activity else []
            description = self.description
            if self.counts is not None:
                done, total, unit, description = self.counts
                share = f" ({done * 100 // total}%)" if total else ""  # floored: '100%' only once all are done
                parts.insert(0, f"{done:,}/{total:,} {unit}{share}")
            elapsed = int(now - self.started)
            parts.append(f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d} elapsed")
            sys.stderr.write(f"{description}: {', '.join(parts)}\n")
            sys.stderr.flush()

    def start_heartbeat(self) -> None:
        """A daemon thread calling `beat` every BEAT_S seconds until `stop_heartbeat`: a line at least every
        PLAIN_EVERY_S (+ BEAT_S) seconds however long the run goes between counts."""
        def beating() -> None:
            # Ctrl-C and SIGTERM reach the process through the main thread only: ahead.py blocks them there
            # across a worker's fork, and one delivered here would run its handler inside that window.
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            while not self._stopped.wait(BEAT_S):
                self.beat()

        self._heartbeat = threading.Thread(target=beating, name="plain-progress", daemon=True)
        self._heartbeat.start()

    def stop_heartbeat(self) -> None:
        self._stopped.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None


class RunProgress:
    """Callable as ``progress(done, total)`` from the engine (ops), a job (replications) or a study (points):
    ``unit`` names what is counted; ``phase`` names what the run does next, `doing` what it does between
    counts (after the count's label). Off a terminal its plain lines (`PlainProgress`), kept coming by its
    heartbeat until `close`."""

    def __init__(self, enabled: bool, unit: str = "ops", description: str = "simulating"):
        self.enabled = enabled and sys.stderr.isatty()
        self.plain = PlainProgress(unit, description) if enabled and not self.enabled else None
        if self.plain is not None:
            self.plain.start_heartbeat()
        self.started = time.monotonic()
        self.counts: tuple[int, int, str, str] | None = None
        self.activity = ""
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        self.unit = unit
        self.description = description

    def __call__(self, done: int, total: int) -> None:
        self._show(done, total, self.unit, self.description)

    def counting(self, unit: str, description: str) -> Callable[[int, int], None]:
        """A ``progress(done, total)`` for a phase counting ``unit`` under ``description`` in the same bar (a
        job's states simulated ahead, before its replications)."""
        return lambda done, total: self._show(done, total, unit, description)

    def doing(self, activity: str) -> None:
        """What the run does now until the next ``activity`` ('' for nothing more than the counts): a job's
        replication and the cluster state it is simulating."""
        self.activity = activity
        if self.plain is not None:
            self.plain.doing(activity)
        if self.counts is not None:
            self._show(*self.counts)

    def _show(self, done: int, total: int, unit: str, description: str) -> None:
        self.counts = done, total, unit, description
        if self.plain is not None:
            self.plain.show(done, total, unit, description)
        if not self.enabled:
            return
        if self.bar is None:
            if time.monotonic() - self.started < SHOW_AFTER_S:
                return
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            # the counts with separators, as the run's last line gives its events ('83877/83877' did not)
            counts = TextColumn("{task.completed:,.0f}/{task.total:,.0f} {task.fields[unit]}")
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), counts, TimeElapsedColumn(),
                                console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(description, total=total, unit=unit)
        if self.task is not None:
            label = f"{description}: {self.activity}" if self.activity else description
            self.bar.update(self.task, completed=done, total=total, description=label, unit=unit)

    def phase(self, description: str) -> None:
        """Show ``description`` (e.g. "writing outputs") in place of the op count's label. The simulation is over
        by then, and the engine reports only every PROGRESS_EVERY ops, so the bar is drawn full; the plain line
        says it after the counts."""
        self.description = description
        if self.plain is not None:
            self.plain.doing(description)
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, description=description, completed=self.bar.tasks[0].total)

    def close(self) -> None:
        if self.plain is not None:
            self.plain.stop_heartbeat()
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
