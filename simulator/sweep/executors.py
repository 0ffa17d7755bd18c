"""Where a sweep's points run: in this process (`serial`), on a local process pool (`local`, the default, all
cores) or on a Dask distributed cluster (`dask`: a scheduler address, or a LocalCluster started here). Each
yields results as they finish; the runner orders them, so every executor gives the same results table."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Protocol

from simulator.errors import ExecutorError
from simulator.sweep.options import ExecutorName

DASK_CONNECT_TIMEOUT_S = 10


class Executor(Protocol):
    """Runs ``fn`` over tasks and yields the results in the order they finish."""

    workers: int

    def map_unordered(self, fn: Callable, tasks: Iterable) -> Iterator: ...

    def close(self) -> None: ...


class SerialExecutor:
    """Every point in this process, one after the other (the reference the others must match)."""

    workers = 1

    def map_unordered(self, fn: Callable, tasks: Iterable) -> Iterator:
        return (fn(task) for task in tasks)

    def close(self) -> None:
        pass


class PoolExecutor:
    """A local process pool, one worker per core by default. All tasks are submitted before the first result
    is read, so the workers are forked before any progress-bar thread starts."""

    def __init__(self, workers: int = 0):
        self.workers = workers or os.cpu_count() or 1
        self._pool = ProcessPoolExecutor(max_workers=self.workers)

    def map_unordered(self, fn: Callable, tasks: Iterable) -> Iterator:
        pending = {self._pool.submit(fn, task) for task in tasks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


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
            self._cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
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
