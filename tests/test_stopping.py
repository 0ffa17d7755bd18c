"""Commands that run points on a pool of worker processes (`trainsim sweep`, `search`, `validate-published`) stop
as a user on a shared machine expects: SIGTERM to the command's process (`kill PID`) or Ctrl-C (SIGINT to it
alone, or to the whole process group as a terminal sends it) ends its workers at once, rather than waiting for
the points they run or leaving them behind, and the command exits 143 or 130 with one line. The workers here
block on their first point until they are ended, so a worker left behind is seen, and the signal is sent only
once a worker says it holds a point (a file), never after a fixed sleep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from shared import DATA, REPO, SCENARIOS

PUBLISHED = SCENARIOS / "published"

BLOCKED_WORKERS = """
import os, signal, sys
from simulator import validation
from simulator.cli import console
from simulator.sweep import runner, search

reached, command = sys.argv[1], sys.argv[2:]
main_process = os.getpid()


def blocked(task, on_rerun=None):  # run_point is given a rerun listener too; run_case the case alone
    if os.getpid() != main_process:
        try:
            os.close(os.open(reached, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
    signal.pause()


runner.run_point = search.run_point = validation.run_case = blocked
sys.argv = ["trainsim", *command]
sys.exit(console())
"""

COMMANDS = {
    "sweep": ["sweep", str(DATA / "sweep_200.yaml"), "--workers", "2", "--quiet"],
    "search": ["search", str(SCENARIOS / "llama3-8b-dgx-h100-dp8.yaml"), "--tp", "1,2", "--pp", "1",
               "--cp", "1", "--top", "2", "--workers", "2", "--quiet"],
    "validate-published": ["validate-published", "--folder", str(PUBLISHED), "--workers", "2",
                           "--case", "nccl-sendrecv-ndr", "--case", "nccl-allreduce-8x-a100"],
}
STOPS = {"SIGTERM": (signal.SIGTERM, False, 143), "Ctrl-C to the process": (signal.SIGINT, False, 130),
         "Ctrl-C to the group": (signal.SIGINT, True, 130)}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("stop", STOPS)
def test_a_stopped_pool_command_ends_its_workers_and_exits_at_once(tmp_path, command, stop):
    """SIGTERM or Ctrl-C, to the process alone or its group, ends a pool command's workers with it and exits at
    once, rather than leaving each worker blocked on its pipe or waiting for the points running."""
    signum, to_group, status = STOPS[stop]
    reached = tmp_path / "reached"
    argv = [*COMMANDS[command], *(["--out", str(tmp_path / "out")] if command != "validate-published" else [])]
    process = subprocess.Popen([sys.executable, "-c", BLOCKED_WORKERS, str(reached), *argv], cwd=tmp_path,
                               env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not reached.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reached.exists(), process.communicate(timeout=10)
        (os.killpg if to_group else os.kill)(process.pid, signum)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == status, stderr
        assert "Traceback" not in stderr and stderr.count("\n") == 1
        assert stderr.startswith("terminated" if signum == signal.SIGTERM else "interrupted")
        with pytest.raises(ProcessLookupError):
            os.killpg(process.pid, 0)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


STOPPED_WHILE_READING = """
import os, random, signal, sys, threading, time
from simulator.sweep.executors import PoolExecutor


def quick(task):
    time.sleep(0.002)
    return task


def stop(_signum, _frame):
    if armed:
        raise KeyboardInterrupt


armed = False
signal.signal(signal.SIGALRM, stop)
draws = random.Random(7)
for trial in range(20):
    executor = PoolExecutor(2)
    try:
        armed = True
        signal.setitimer(signal.ITIMER_REAL, draws.uniform(0.05, 0.3))
        for _ in executor.map_unordered(quick, range(2000)):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
    closing = threading.Thread(target=executor.close, daemon=True)
    closing.start()
    closing.join(60)
    if closing.is_alive():
        for process, _ in executor._workers:
            process.kill()
        print(f"close() hung after trial {trial}", flush=True)
        os._exit(1)
print("closed every time", flush=True)
"""


def test_a_pool_stopped_while_it_hands_out_results_closes_every_time():
    """A stop lands wherever the reading process is while many cheap points finish (20 stops, at moments drawn from
    a seeded range); `close` must return each time. No trial depends on where its stop lands; the 60 s join only
    turns a hang into a failure (in a child, whose exit would wait on the hung pool)."""
    run = subprocess.run([sys.executable, "-c", STOPPED_WHILE_READING], env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout == "closed every time\n", run.stdout + run.stderr


STOPPED_AT_EVERY_RETURN = """
import os, signal, sys, threading
from simulator.sweep.executors import PoolExecutor

MAIN = os.getpid()


def quick(task):
    return task


class StopAt:
    def __init__(self, at):
        self.at, self.seen, self.where = at, 0, ""

    def __call__(self, frame, event, arg):
        if os.getpid() != MAIN:
            sys.settrace(None)
            return None
        frame.f_trace_lines = False
        return self.returned

    def returned(self, frame, event, arg):
        if event == "return" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.seen += 1
            if self.seen == self.at:
                self.where = frame.f_code.co_qualname
                raise KeyboardInterrupt
        return self.returned


def trial(at):
    executor = PoolExecutor(2)
    stop = StopAt(at)
    sys.settrace(stop)
    try:
        for _ in executor.map_unordered(quick, range(4)):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    closing = threading.Thread(target=executor.close, daemon=True)
    closing.start()
    closing.join(20)
    with open(f"/proc/self/task/{MAIN}/children") as children:
        left = [int(pid) for pid in children.read().split()]
    if closing.is_alive() or left:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        print(f"close() {'hung' if closing.is_alive() else 'left workers'} after a stop at {stop.where}", flush=True)
        os._exit(1)
    return stop.seen


trial(0)
for at in range(1, trial(0) + 1):
    trial(at)
print("closed every time", flush=True)
"""


def test_a_pool_stopped_at_any_return_of_its_reading_thread_closes_every_time():
    """Ctrl-C raises wherever the main thread returns from a Python function while Python's handler is in place (another
    thread may take the signal, so blocking it in this thread is no shield): a trace raises KeyboardInterrupt at each
    such return of a map in turn, and `close` must return and leave no worker. (Over ProcessPoolExecutor, a stop as
    `add_done_callback` had just taken a future's lock would leave the pool's thread waiting on it for good, and one
    as a worker had just been forked would leave that worker out of `close`'s reach.)"""
    run = subprocess.run([sys.executable, "-c", STOPPED_AT_EVERY_RETURN], env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout == "closed every time\n", run.stdout + run.stderr


LEFT_OPEN = """
import sys
from simulator.sweep.executors import PoolExecutor

executor = PoolExecutor(2)
results = executor.map_unordered(abs, [-1, -2, -3, -4, -5])
print(next(results), flush=True)
if sys.argv[1] == "raise":
    raise SystemExit(3)
"""


@pytest.mark.parametrize("how", ["return", "raise"])
def test_a_program_that_never_closes_its_pool_still_exits(how):
    """A program that maps and leaves without `close` (its end, or an exception that skips a `finally`-less close)
    exits at once: the workers are daemonic, ended at exit."""
    run = subprocess.run([sys.executable, "-c", LEFT_OPEN, how], env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == (0 if how == "return" else 3), run.stderr
    assert run.stdout.strip() in {"1", "2", "3", "4", "5"}


DROPPED = """
import gc, os
from simulator.sweep.executors import PoolExecutor


def open_descriptors():
    gc.collect()
    return sorted(os.listdir("/proc/self/fd"))


warm = PoolExecutor(2)
list(warm.map_unordered(abs, range(4)))
warm.close()
before = open_descriptors()
executor = PoolExecutor(4)
assert sorted(executor.map_unordered(abs, range(-8, 0))) == list(range(1, 9))
del executor
print(before == open_descriptors(), len(before), len(open_descriptors()), flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="counts this process's descriptors in /proc/self/fd")
def test_a_pool_dropped_without_close_releases_its_workers_descriptors():
    """A pool mapped and dropped without `close` (del, then the collector) leaves the descriptors open before it open,
    and no worker: its four workers' process sentinels do not stay open until the next pool starts (14 descriptors
    where 6 were). In a child, so that no other test's pools come and go while it counts."""
    run = subprocess.run([sys.executable, "-c", DROPPED], env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    same, before, after = run.stdout.split()
    assert same == "True", f"{before} descriptors open before the pool, {after} after"


def test_a_pool_forks_its_workers_from_the_main_thread_only():
    """Linux kills a worker when the thread that forked it ends (`PR_SET_PDEATHSIG`), so a map begun in a thread that
    ends before it would lose its workers and the main thread reading the rest get WorkerKilled: a map that would
    fork off the main thread is an ExecutorError saying so; the same pool then maps from the main thread."""
    from simulator.errors import ExecutorError
    from simulator.sweep.executors import MAIN_THREAD_ONLY, PoolExecutor

    executor = PoolExecutor(2)
    results = executor.map_unordered(abs, range(-4, 0))
    raised: list[BaseException] = []

    def first_result():
        try:
            next(results)
        except BaseException as exc:
            raised.append(exc)

    begun = threading.Thread(target=first_result)
    begun.start()
    begun.join(60)
    try:
        assert not begun.is_alive()
        assert [type(exc) for exc in raised] == [ExecutorError] and str(raised[0]) == MAIN_THREAD_ONLY
        assert sorted(executor.map_unordered(abs, range(-4, 0))) == [1, 2, 3, 4]
    finally:
        executor.close()


KILLED_WHILE_WORKING = """
import os, signal, sys
from pathlib import Path
from simulator.sweep.executors import PoolExecutor

reached = Path(sys.argv[1])


def blocked(task):
    (reached / str(os.getpid())).touch()
    signal.pause()


for _ in PoolExecutor(2).map_unordered(blocked, range(2)):
    pass
"""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="a worker asks to die with its parent through Linux's prctl")
def test_the_workers_of_a_pool_killed_with_sigkill_end_with_it(tmp_path):
    """`kill -9` of a sweep or search (or the out-of-memory killer choosing it) ends its workers too, not left to run on
    with their points (here blocked for good). The wait for them is bounded, never a fixed sleep."""
    process = subprocess.Popen([sys.executable, "-c", KILLED_WHILE_WORKING, str(tmp_path)],
                               env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and process.poll() is None and time.monotonic() < deadline:
            workers = [int(path.name) for path in tmp_path.iterdir()]
            time.sleep(0.01)
        assert len(workers) == 2
        process.kill()
        process.wait(timeout=60)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(_alive(pid) for pid in workers)
    finally:
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.kill()
        process.wait(timeout=60)


def _killed(_task, _on_rerun=None):
    """`run_point` for a worker ended from outside: it takes the point and the rerun listener `timed_point` passes."""
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("command", ["sweep", "search"])
def test_a_killed_worker_is_one_line_and_status_1(command, tmp_path, capsys, monkeypatch):
    """A worker ended from outside (the out-of-memory killer, `kill -9`): sweep and search print one line saying what
    happened and what is kept, and exit 1, without a BrokenProcessPool traceback (the lines before it name the
    points, or the search's layouts, handed out)."""
    from simulator.cli import main
    from simulator.sweep import runner

    monkeypatch.setattr(runner, "run_point", _killed)  # both run each point through `runner.timed_point`
    argv = [*COMMANDS[command][:-1], "--out", str(tmp_path / "out")]
    assert main(argv) == 1
    kept = (f"the finished points are in {tmp_path / 'out'}/results.parquet; run again to resume"
            if command == "sweep" else
            "the search wrote nothing; run it again, with fewer --workers if memory is short")
    *handed_out, error = capsys.readouterr().err.splitlines()
    assert error == f"error: a worker process was killed (out of memory?); {kept}"
    handed = "sweep: simulating point " if command == "sweep" else "search: simulating TP"
    assert handed_out and all(line.startswith(handed) for line in handed_out)
