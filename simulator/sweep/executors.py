"""Where a sweep's points run: in this process (`serial`), on a local process pool (`local`, the default, all
cores) or on a Dask distributed cluster (`dask`: a scheduler address, or a LocalCluster started here). Each
yields results as they finish; the runner orders them, so every executor gives the same results table."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from simulator.console.progress import resume_heartbeats
from simulator.errors import STOP_SIGNALS, ExecutorError, WorkerKilled
from simulator.machine import usable_cores
from simulator.report.run_folder import interrupts_held
from simulator.sweep.options import ExecutorName

DASK_CONNECT_TIMEOUT_S = 10


class Executor(Protocol):
    """Runs ``fn`` over tasks and yields the results in the order they finish; ``starting``, where given, hears
    of each task in this process as it is handed to a worker (a Dask scheduler hands them out on its own: never)."""

    workers: int

    def map_unordered(self, fn: Callable, tasks: Iterable, starting: Callable | None = None) -> Iterator: ...

    def close(self) -> None:
        """Release the workers; tasks still running (the caller stopped reading: Ctrl-C, SIGTERM, an error)
        are ended, not waited for."""


class SerialExecutor:
    """Every point in this process, one after the other (the reference the others must match)."""

    workers = 1

    def map_unordered(self, fn: Callable, tasks: Iterable, starting: Callable | None = None) -> Iterator:
        for task in tasks:
            if starting is not None:
                starting(task)
            yield fn(task)

    def close(self) -> None:
        pass


class PoolExecutor:
    """A local pool of worker processes of its own, one per usable core by default (`machine.usable_cores`), each
    handed one task at a time over its own pipe. Its workers are forked when a map starts, from the main thread
    only (`_start`), with Ctrl-C and SIGTERM held back until each has left both to this process
    (`_worker_started`): Ctrl-C at a terminal reaches the whole process group, and this process alone decides to
    stop. `close` kills the workers (SIGKILL) and reads nothing more, so it returns at once wherever a stop
    landed. Before, over concurrent.futures' ProcessPoolExecutor, a stop that landed while this thread held a
    future's lock (a signal handler raising as `add_done_callback` had just taken it, which a Ctrl-C can do once
    another thread such as the progress bar's may take the signal) left the pool's own thread waiting on that
    lock, and `close` waited on the thread for good (4 stops in 121 of many cheap points, on 2 cores beside two
    busy processes)."""

    def __init__(self, workers: int = 0):
        self.workers = workers or usable_cores()
        self._workers: list[tuple[BaseProcess, Connection]] = []
        self._owner = os.getpid()
        weakref.finalize(self, _end_workers, self._workers, self._owner)

    def map_unordered(self, fn: Callable, tasks: Iterable, starting: Callable | None = None) -> Iterator:
        """Each task's result as it finishes, ``starting`` told of each as it goes down a worker's pipe; a task's
        exception is raised here, with the worker's traceback as its cause. A worker ended from outside (the
        out-of-memory killer, `kill -9`) is a WorkerKilled, not a traceback: its end of the pipe closes, which
        this process sees even in the middle of a result."""
        todo = list(tasks)
        self.close()
        self._start(fn, min(self.workers, len(todo)))
        waiting = iter(todo)
        busy = [pipe for _, pipe in self._workers if _hand_out(pipe, waiting, starting)]
        while busy:
            ready = wait(busy)
            for pipe in [pipe for pipe in busy if pipe in ready]:
                try:
                    failed, value, remote_traceback = pipe.recv()
                    if not _hand_out(pipe, waiting, starting):
                        busy.remove(pipe)
                except (EOFError, OSError):
                    raise WorkerKilled("a worker process was killed (out of memory?)") from None
                if failed:
                    raise value from RemoteTraceback(remote_traceback)
                yield value

    def _start(self, fn: Callable, count: int) -> None:
        """Fork ``count`` workers running ``fn``, each known to `close` before a stop can end this method. Each
        closes the pipes of the workers before it, so that a pipe's only ends are this process and its worker.
        Forked by name (Python 3.14 makes forkserver Linux's default), and daemonic: a program that leaves
        without `close` (an exception that skips it, a script that never calls it) has them ended at exit, where
        before the interpreter waited for workers blocked on pipes it still held, for good. From the main thread
        only, an ExecutorError elsewhere: Linux kills each worker when the thread that forked it ends
        (`_worker_started`), so a map begun in a thread that ended before the map did lost its workers and raised
        WorkerKilled."""
        if threading.current_thread() is not threading.main_thread():
            raise ExecutorError(MAIN_THREAD_ONLY)
        context = get_context("fork")
        with interrupts_held():
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                for _ in range(count):
                    mine, theirs = context.Pipe()
                    others = [pipe for _, pipe in self._workers]
                    process = context.Process(target=_serve, args=(fn, theirs, others, os.getpid()),
                                              name="trainsim pool worker", daemon=True)
                    process.start()
                    theirs.close()
                    self._workers.append((process, mine))
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        resume_heartbeats()  # the progress bar goes on while the workers run their first points

    def close(self) -> None:
        """Kill the workers, busy or idle (a point leaves nothing to clean up), and reap them. A pool dropped
        without it is closed as it is collected, or at exit (a finalizer): before, its workers' process
        sentinels stayed open, two descriptors a worker, until the next pool started (14 open after a pool of 4
        where 6 were before it)."""
        _end_workers(self._workers, self._owner)


def _end_workers(workers: list[tuple[BaseProcess, Connection]], owner: int) -> None:
    """Kill, reap and forget ``workers`` and close their pipes and sentinels, in ``owner``, the process that
    made the pool, alone: a worker forked while a dropped pool awaited the cyclic collector inherits that pool
    and its finalizer, and must not kill its siblings."""
    if os.getpid() != owner:
        return
    with interrupts_held():
        for process, _ in workers:
            process.kill()
        for process, pipe in workers:
            process.join()
            process.close()
            pipe.close()
        workers.clear()


MAIN_THREAD_ONLY = ("the local executor starts its worker processes from the main thread only (each is killed when "
                    "the thread that started it ends); map from the main thread, or use the serial executor")


def _hand_out(pipe: Connection, waiting: Iterator, starting: Callable | None = None) -> bool:
    """Send the next waiting task down ``pipe``, ``starting`` told of it; False when none is left."""
    task = next(waiting, _NONE_LEFT)
    if task is _NONE_LEFT:
        return False
    pipe.send(task)
    if starting is not None:
        starting(task)
    return True


_NONE_LEFT = object()


def _serve(fn: Callable, pipe: Connection, others: list[Connection], parent: int) -> None:
    """A worker's life: each task read from ``pipe`` answered with (failed, result or exception, the exception's
    traceback as text), until the pipe closes. ``others``: the earlier workers' pipes, inherited and not ours;
    ``parent``: the process that forked it."""
    _worker_started(parent)
    for other in others:
        other.close()
    while True:
        try:
            task = pipe.recv()
        except EOFError:
            return
        try:
            outcome: tuple[bool, Any, str] = (False, fn(task), "")
        except BaseException as exc:
            outcome = (True, exc, _traceback(exc))
        try:
            pipe.send(outcome)
        except Exception as exc:  # a result or exception that cannot be pickled
            pipe.send((True, exc, _traceback(exc)))


class RemoteTraceback(Exception):
    """A worker's exception's traceback, as text: the cause of that exception re-raised in this process."""

    def __str__(self) -> str:
        return str(self.args[0])


def _traceback(exc: BaseException) -> str:
    return "\n" + "".join(traceback.format_exception(exc))


def _worker_started(parent: int) -> None:
    """In a pool worker, before its first task: Ctrl-C ignored and SIGTERM's default restored (the handlers it
    was forked with would raise KeyboardInterrupt inside a point and print a traceback), then both unblocked
    (`PoolExecutor._start` forks it with them blocked); and, on Linux, killed when the thread that forked it
    ends, which it does when ``parent`` ends, even by SIGKILL (before, the workers of a killed sweep ran on)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # it ended before the request: nothing will send the signal
            os._exit(1)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


PR_SET_PDEATHSIG = 1
"""prctl's option that has the kernel send a signal to this process when its parent thread ends (linux/prctl.h)."""


class DaskExecutor:
    """Dask distributed: connect to ``scheduler`` (tcp://HOST:8786) or start a LocalCluster of ``workers``
    single-threaded worker processes, without a dashboard and with the scheduler's HTTP routes on a free port (the
    scheduler serves them on 8787 by default, so a second cluster on the machine warned of the port in use). An
    unreachable scheduler is an ExecutorError naming the address."""

    def __init__(self, scheduler: str | None = None, workers: int = 0, timeout_s: float = DASK_CONNECT_TIMEOUT_S):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise ExecutorError("the dask executor needs dask[distributed]: pip install 'trainsim[dask]'") from None
        self._cluster = None
        if scheduler:
            try:
                self._client = Client(scheduler, timeout=timeout_s, set_as_default=False)
            except (OSError, TimeoutError) as exc:
                raise ExecutorError(f"cannot reach the Dask scheduler at {scheduler} ({type(exc).__name__})") from None
        else:
            self._cluster = LocalCluster(n_workers=workers or usable_cores(), threads_per_worker=1,
                                         processes=True, dashboard_address=None,
                                         scheduler_kwargs={"dashboard_address": ":0"},
                                         silence_logs=logging.ERROR)
            self._client = Client(self._cluster, set_as_default=False)
        self.workers = max(len(self._client.scheduler_info().get("workers", {})), 1)

    def map_unordered(self, fn: Callable, tasks: Iterable, starting: Callable | None = None) -> Iterator:
        from distributed import as_completed

        futures = self._client.map(fn, list(tasks), pure=False)
        for future in as_completed(futures, loop=self._client.loop):
            yield future.result()

    def close(self) -> None:
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()


def check_executor_options(name: ExecutorName, workers: int = 0, scheduler: str | None = None) -> None:
    """Refuse a `--scheduler` or `--workers` the executor ``name`` would ignore, for the commands and
    `make_executor` alike."""
    from simulator.console.paths import option_error

    if scheduler is not None and name != "dask":
        raise option_error("--scheduler", f"--executor {name} uses no Dask scheduler: the points would run on this "
                           "machine", "--scheduler with --executor dask")
    if workers and name == "serial":
        raise option_error("--workers", "--executor serial runs every point in this process, one at a time",
                           "--workers with --executor local, or dask without --scheduler")
    if workers and scheduler is not None:
        raise option_error("--workers", "a Dask scheduler's workers are the ones started with it (dask worker "
                           "--nworkers)", "--workers with --executor local, or dask without --scheduler")


def make_executor(name: ExecutorName, workers: int = 0, scheduler: str | None = None) -> Executor:
    """The executor called ``name`` (one of sweep/options.EXECUTORS); a ``workers`` or ``scheduler`` it would
    ignore is refused (`check_executor_options`)."""
    check_executor_options(name, workers, scheduler)
    if name == "serial":
        return SerialExecutor()
    if name == "dask":
        return DaskExecutor(scheduler, workers)
    return PoolExecutor(workers)
