"""Where a sweep's points run: in this process (`serial`), on a local process pool (`local`, the default, all
cores) or on a Dask distributed cluster (`dask`: a scheduler address, or a LocalCluster started here). Each
yields results as they finish; the runner orders them, so every executor gives the same results table."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from queue import SimpleQueue
from typing import Any, Protocol

from simulator.errors import STOP_SIGNALS, ExecutorError, WorkerKilled
from simulator.machine import usable_cores
from simulator.report.run_folder import interrupts_held
from simulator.sweep.options import ExecutorName

DASK_CONNECT_TIMEOUT_S = 10


class Executor(Protocol):
    """Runs ``fn`` over tasks and yields the results in the order they finish."""

    workers: int

    def map_unordered(self, fn: Callable, tasks: Iterable) -> Iterator: ...

    def close(self) -> None:
        """Release the workers; tasks still running (the caller stopped reading: Ctrl-C, SIGTERM, an error)
        are ended, not waited for."""


class SerialExecutor:
    """Every point in this process, one after the other (the reference the others must match)."""

    workers = 1

    def map_unordered(self, fn: Callable, tasks: Iterable) -> Iterator:
        return (fn(task) for task in tasks)

    def close(self) -> None:
        pass


class PoolExecutor:
    """A local process pool, one worker per usable core by default (`machine.usable_cores`). All tasks are
    submitted before the first result is read, so the workers are forked before any progress-bar thread starts,
    with Ctrl-C and SIGTERM blocked until each worker has left both to this process (`_worker_started`): Ctrl-C
    at a terminal reaches the whole process group, and this process alone decides to stop. Closed with tasks
    still running, it ends its workers: before, SIGTERM ended this process at once and left a worker blocked on
    its pipe forever, and Ctrl-C sent to this process alone waited for the running points to finish."""

    def __init__(self, workers: int = 0):
        self.workers = workers or usable_cores()
        self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=_worker_started)
        self._futures: list[Future] = []

    def map_unordered(self, fn: Callable, tasks: Iterable) -> Iterator:
        """Each task's result as it finishes. Each future hands its outcome to a queue from the pool's thread,
        and this thread takes them one by one (`SimpleQueue.get`, which holds no lock of Python's when a signal
        stops it): before, `concurrent.futures.wait` took every pending future's lock at each call, so Ctrl-C or
        SIGTERM there left locks held and `close` waited on them forever (1 stop in 8 of a sweep of cheap
        points), and the waits grew with the square of the tasks (8,000 trivial tasks: 10 s of this process's
        CPU). A worker ended from outside (the out-of-memory killer, `kill -9`) is a WorkerKilled, not a
        traceback."""
        outcomes: SimpleQueue[tuple[bool, Any]] = SimpleQueue()
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self._futures = [self._pool.submit(fn, task) for task in tasks]
            for future in self._futures:
                future.add_done_callback(lambda done: outcomes.put(_outcome(done)))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        for _ in self._futures:
            failed, value = outcomes.get()
            if isinstance(value, BrokenProcessPool):
                raise WorkerKilled("a worker process was killed (out of memory?)") from None
            if failed:
                raise value
            yield value

    def close(self) -> None:
        running = any(not future.done() for future in self._futures)
        with interrupts_held():
            if running:
                for process in list((self._pool._processes or {}).values()):  # public only from Python 3.14
                    process.terminate()
            self._pool.shutdown(wait=True, cancel_futures=True)


def _outcome(future: Future) -> tuple[bool, Any]:
    """A finished future's (failed, result or exception), taken in the pool's thread, where no signal handler
    runs, so the thread that reads it never takes the future's lock."""
    if future.cancelled():
        return True, CancelledError()
    exception = future.exception()
    return (True, exception) if exception is not None else (False, future.result())


def _worker_started() -> None:
    """In a pool worker, before its first task: Ctrl-C ignored and SIGTERM's default restored (the handlers it
    was forked with would raise KeyboardInterrupt inside a point and print a traceback), then both unblocked
    (`PoolExecutor.map_unordered` forks it with them blocked). The pool's process ends it with SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class DaskExecutor:
    """Dask distributed: connect to ``scheduler`` (tcp://HOST:8786) or start a LocalCluster of ``workers``
    single-threaded worker processes. An unreachable scheduler is an ExecutorError naming the address."""

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
                                         silence_logs=logging.ERROR)
            self._client = Client(self._cluster, set_as_default=False)
        self.workers = max(len(self._client.scheduler_info().get("workers", {})), 1)

    def map_unordered(self, fn: Callable, tasks: Iterable) -> Iterator:
        from distributed import as_completed

        futures = self._client.map(fn, list(tasks), pure=False)
        for future in as_completed(futures, loop=self._client.loop):
            yield future.result()

    def close(self) -> None:
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()


def make_executor(name: ExecutorName, workers: int = 0, scheduler: str | None = None) -> Executor:
    """The executor called ``name`` (one of sweep/options.EXECUTORS)."""
    if name == "serial":
        return SerialExecutor()
    if name == "dask":
        return DaskExecutor(scheduler, workers)
    return PoolExecutor(workers)
