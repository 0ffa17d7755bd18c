"""Progress of a long run on stderr, unless the user asked for --quiet: on a terminal a rich bar for runs longer
than a second; off one (a pipe, a log file, a batch job's output) a plain line every PLAIN_EVERY_S seconds, so
that a job of minutes shows it is alive without filling a log with a bar's redraws (nor importing rich's
progress module). Both are read from one `Status` (the last count, and what the run does between counts: the
cluster state a job's replication is simulating, writing its outputs), and a `Heartbeat` thread keeps them
coming while no count arrives: it redraws the bar, or prints the plain line when due (a 2,048-GPU job's first
replication spends minutes simulating its degraded leaf states between counts). The heartbeat is ended before
the process forks and started again once the forker is done forking (`resume_heartbeats`), or at the run's next
report, so that a worker forked from a job (reliability/ahead.py) or a sweep's pool never inherits a lock it
held."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from simulator.errors import STOP_SIGNALS
from simulator.stops import raise_dropped

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

SHOW_AFTER_S = 1.0
"""A run that finishes within this many seconds never shows the bar."""
PLAIN_EVERY_S = 10.0
"""Off a terminal, a progress line at most this often, the first this long after the start (a run shorter than
this prints none)."""
BEAT_S = 1.0
"""How often the heartbeat looks whether a plain line is due: lines come at most this much later than
PLAIN_EVERY_S apart while a run is busy between counts."""
REDRAW_S = 0.1
"""How often the heartbeat redraws the bar on a terminal (rich's own rate)."""


class Status:
    """What a run has reported: its last count and what it does between counts. The plain line and the bar's
    label are both worked out here, so that they say the same."""

    def __init__(self, unit: str, description: str) -> None:
        self.unit = unit
        self.description = description
        """What the run counts, and the words before its counts, until a phase counts something else."""
        self.counts: tuple[int, int, str, str] | None = None
        """The last count: done, total, unit, description."""
        self.activity = ""
        """What the run does now, between counts ('' for nothing more than the counts)."""
        self.left_s: float | None = None
        """The seconds the count is expected to take yet, where its phase estimates them (`RunProgress.counting`
        with ``eta``), else None."""

    def label(self) -> str:
        """The bar's label: the count's description, and the activity after it."""
        description = self.description if self.counts is None else self.counts[3]
        return f"{description}: {self.activity}" if self.activity else description

    def line(self, elapsed_s: float) -> str:
        """The plain line: `DESCRIPTION: DONE/TOTAL UNIT (P%), ACTIVITY, H:MM:SS elapsed, about H:MM:SS left`,
        each part there is."""
        parts = [self.activity] if self.activity else []
        description = self.description
        if self.counts is not None:
            done, total, unit, description = self.counts
            share = f" ({done * 100 // total}%)" if total else ""  # floored: '100%' only once all are done
            parts.insert(0, f"{done:,}/{total:,} {unit}{share}")
        parts.append(f"{clock(elapsed_s)} elapsed")
        if self.left_s is not None:
            parts.append(f"about {clock(self.left_s)} left")
        return f"{description}: {', '.join(parts)}"


def clock(seconds: float) -> str:
    """Whole seconds as H:MM:SS (hours past 99 as they are)."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class PlainProgress:
    """Progress off a terminal: its `Status`'s line on stderr at most every PLAIN_EVERY_S seconds of ``clock``;
    callable as ``progress(done, total)`` for one ``unit`` and ``description`` (a sweep's and a search's
    points), and `beat` prints the line anew once it is due (a `Heartbeat` calls it). A run's `RunProgress`
    sets this status's counts and activity itself (a job's phases) and calls `beat`; `show` (counts in any unit)
    serves ``progress(done, total)`` and the tests."""

    def __init__(self, unit: str = "ops", description: str = "simulating",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.status = Status(unit, description)
        self.clock = clock
        self.started = self.last = clock()
        self._lock = threading.Lock()

    def __call__(self, done: int, total: int) -> None:
        self.show(done, total, self.status.unit, self.status.description)

    def show(self, done: int, total: int, unit: str, description: str) -> None:
        self.status.counts = done, total, unit, description
        self.beat()

    def beat(self) -> None:
        """The progress line, if PLAIN_EVERY_S seconds have passed since the last (or the start)."""
        with self._lock:
            now = self.clock()
            if now - self.last < PLAIN_EVERY_S:
                return
            self.last = now
            sys.stderr.write(f"{self.status.line(now - self.started)}\n")
            sys.stderr.flush()


class Heartbeat:
    """``beat()`` every ``every()`` seconds on a daemon thread, from `start` to `stop`. Ctrl-C and SIGTERM are
    blocked in the thread: they reach the process through the main thread only, which ahead.py blocks them in
    across a worker's fork.

    No heartbeat thread is alive while the process forks: the thread is ended before each fork
    (`os.register_at_fork`, below; a beat under way finishes first) and started again by `resume` at the run's
    next report, or by `resume_heartbeats`, which a forker that then waits without reporting must call once its
    forks are done (ahead.py and the sweep's pool, on their workers). So a child forked meanwhile inherits no
    lock a beat held (stderr's buffer, rich's console: a worker that then wrote to stderr, or flushed it on its
    way out, blocked for ever), and the process forks alone, as Python 3.12+ asks (it warns of a fork beside
    threads; 3.12 counts the system's threads, so the hook waits until the ended one has left them, `_gone`).
    Chosen over a lock every fork site would take around its fork (the warning would stay) and over a SIGALRM
    timer on the main thread (its handler's line could come inside the main thread's own write to stderr, a
    reentrant write). Not started again by a hook right after each fork: Python 3.13 counts the threads after
    the fork's hooks have run (and ahead.py forks its workers one after the other)."""

    def __init__(self, beat: Callable[[], None], every: Callable[[], float]) -> None:
        self.beat = beat
        self.every = every
        self.started = False
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.started = True
        _BEATING.append(self)
        self._launch()

    def stop(self) -> None:
        if self.started:
            self.started = False
            _BEATING.remove(self)
            self._halt()

    def resume(self) -> None:
        """Start the thread again where a fork ended it."""
        if self.started and self._thread is None:
            self._launch()

    @property
    def alive(self) -> bool:
        """Whether its thread is running (read by the tests)."""
        return self._thread is not None

    def _launch(self) -> None:
        stop = self._stop = threading.Event()

        def beating() -> None:
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            while not stop.wait(self.every()):
                self.beat()

        self._thread = threading.Thread(target=beating, name="progress-heartbeat", daemon=True)
        self._thread.start()

    def _halt(self) -> None:
        """End the thread once its beat, if one is under way, is over. Forgotten even when the join is
        interrupted (a Ctrl-C inside the fork hook, which CPython reports and drops): the thread ends anyway, its
        stop set, and `resume` starts another (before, the heartbeat stayed silent for the rest of the run)."""
        try:
            if self._stop is not None and self._thread is not None:
                self._stop.set()
                self._thread.join()
                _gone(self._thread.native_id)
        finally:
            self._stop = self._thread = None


def _gone(native_id: int | None) -> None:
    """Wait, at most GONE_WAIT_S, until the system's thread ``native_id`` of this process has exited (Linux: its
    /proc entry is gone). Python's join returns a moment before it has, and Python 3.12 counts the system's
    threads at a fork: it warned at about half the fork rounds of a job whose heartbeat ran before them."""
    task = f"/proc/self/task/{native_id}"
    waited = time.monotonic()
    while native_id is not None and os.path.exists(task) and time.monotonic() - waited < GONE_WAIT_S:
        time.sleep(GONE_WAIT_S / 1000)


GONE_WAIT_S = 0.1
"""The longest `_gone` waits for a heartbeat's ended thread to leave the system's count."""


_BEATING: list[Heartbeat] = []
"""The heartbeats started and not stopped: their threads are ended before each fork of this process."""


def resume_heartbeats() -> None:
    """Start again the heartbeats this process's forks ended. A forker that then waits on its children without
    reporting calls it once its forks are done (ahead.py, the sweep's pool): before, the lines and the bar's
    redraws stopped until a worker handed back its first result (a state's step, a sweep's point), however
    long it took."""
    for heartbeat in _BEATING:
        heartbeat.resume()


def _halted_for_fork() -> None:
    for heartbeat in _BEATING:
        heartbeat._halt()


def _none_in_child() -> None:
    """A forked child starts no heartbeat: its parent prints the progress."""
    for heartbeat in _BEATING:
        heartbeat.started = False
    _BEATING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_halted_for_fork, after_in_child=_none_in_child)


class PhaseCount:
    """A phase's count (`RunProgress.counting`), called as ``count(done, total)``; `sharing` tells it how many
    processes will share the rest where those done so far ran one at a time (a job's first states ahead,
    simulated in its process before its workers share the others: the first time left the bar gave counted
    them one after the other, whatever --workers)."""

    def __init__(self, shown: Callable[[int, int, int], None]) -> None:
        self._shown = shown
        self._sharing = 1

    def __call__(self, done: int, total: int) -> None:
        sharing, self._sharing = self._sharing, 1
        self._shown(done, total, sharing)

    def sharing(self, processes: int) -> None:
        """The next count's time left shares the rest between ``processes`` (that count's only: the rate of
        those after it is already shared)."""
        self._sharing = processes


class RunProgress:
    """Callable as ``progress(done, total)`` from the engine (ops), a job (replications) or a study (points):
    ``unit`` names what is counted; `counting` gives a phase's own count, `doing` what the run does between
    counts ('writing outputs' at the end). Each goes into one `Status` and out through `_shown`: the bar on a
    terminal, else the plain lines (`PlainProgress`); a `Heartbeat` keeps either coming until `close`."""

    def __init__(self, enabled: bool, unit: str = "ops", description: str = "simulating"):
        self.enabled = enabled and sys.stderr.isatty()
        self.plain = PlainProgress(unit, description) if enabled and not self.enabled else None
        self.status = self.plain.status if self.plain is not None else Status(unit, description)
        self.started = time.monotonic()
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        self.heartbeat: Heartbeat | None = None
        if self.plain is not None:
            self.heartbeat = Heartbeat(self.plain.beat, lambda: BEAT_S)
            self.heartbeat.start()

    def __call__(self, done: int, total: int) -> None:
        self.status.counts = done, total, self.status.unit, self.status.description
        self.status.left_s = None
        self._shown()

    def counting(self, unit: str, description: str, *, passing: bool = False, eta: bool = False) -> PhaseCount:
        """A ``progress(done, total)`` for a phase counting ``unit`` under ``description`` in the same bar (a
        job's states simulated ahead, before its replications). ``passing``: the count leaves the status once
        all are done, and the bar with it until the next count (an elastic job's sizes, checked before its
        healthy step is simulated, which would otherwise read as 'checking elastic sizes' all through it).
        ``eta``: once one is done, the time the rest will take at the phase's rate so far (its time since its
        count of none, over those done, the rest shared by the processes `PhaseCount.sharing` says will share
        them): a job's states ahead take hours where each takes minutes, and the bar said only
        '0/19,663 states'."""
        began = self._now()

        def counted(done: int, total: int, sharing: int) -> None:
            nonlocal began
            now = self._now()
            if done == 0:
                began = now
            self.status.counts = None if passing and done >= total else (done, total, unit, description)
            self.status.left_s = (now - began) / done * (total - done) / sharing if eta and done else None
            self._shown()

        return PhaseCount(counted)

    def _now(self) -> float:
        """The time the counts are timed by: the plain lines' clock off a terminal (the tests set it)."""
        return self.plain.clock() if self.plain is not None else time.monotonic()

    def doing(self, activity: str) -> None:
        """What the run does now until the next ``activity`` ('' for nothing more than the counts): a job's
        replication and the cluster state it is simulating; 'writing outputs' once the simulation is over."""
        self.status.activity = activity
        self._shown()

    def anew(self, activity: str) -> None:
        """A new run of the step: the last run's count leaves the status, ``activity`` says what is done until the
        new run counts its own ops (a refold's build, after its fold was given up)."""
        self.status.counts = None
        self.status.left_s = None
        self.doing(activity)

    def _shown(self) -> None:
        """The status as it now is: the plain line if due, or the bar (started once the run has gone on for
        SHOW_AFTER_S and has a count), which the heartbeat redraws; the heartbeat started again if a fork ended
        it. First a stop that Python dropped is raised (stops.py): each report is a safe point of the
        run."""
        raise_dropped()
        if self.heartbeat is not None:
            self.heartbeat.resume()
        if self.plain is not None:
            self.plain.beat()
        if not self.enabled:
            return
        if self.status.counts is None:
            self._hide_bar()
            return
        done, total, unit, _ = self.status.counts
        if self.bar is None:
            if time.monotonic() - self.started < SHOW_AFTER_S:
                return
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            # the counts with separators, as the run's last line gives its events ('83877/83877' did not)
            counts = TextColumn("{task.completed:,.0f}/{task.total:,.0f} {task.fields[unit]}")
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), counts, TimeElapsedColumn(),
                                TextColumn("{task.fields[left]}"), console=Console(stderr=True), transient=True,
                                auto_refresh=False)
            self.task = self.bar.add_task(self.status.label(), total=total, unit=unit, left=self._left())
            self.bar.start()
            self.heartbeat = Heartbeat(self.bar.refresh, lambda: REDRAW_S)
            self.heartbeat.start()
        if self.task is not None:
            self.bar.update(self.task, completed=done, total=total, description=self.status.label(), unit=unit,
                            left=self._left())

    def say(self, line: str) -> None:
        """``line`` on stderr as it happens, above the bar where one is drawn (whatever --quiet: it is news of
        the run, not its progress)."""
        if self.bar is not None:
            self.bar.console.print(line, highlight=False, soft_wrap=True, markup=False)
        else:
            sys.stderr.write(f"{line}\n")
            sys.stderr.flush()

    def _left(self) -> str:
        """The bar's estimate of the time left, '' where the count has none."""
        return "" if self.status.left_s is None else f"about {clock(self.status.left_s)} left"

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        self._hide_bar()

    def _hide_bar(self) -> None:
        """Take the bar off the terminal (it is transient) and end its redraws; the next count shows a new one."""
        if self.bar is not None:
            if self.heartbeat is not None:
                self.heartbeat.stop()
                self.heartbeat = None
            self.bar.stop()
            self.bar = self.task = None

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
