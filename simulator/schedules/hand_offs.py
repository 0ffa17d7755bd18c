"""How many stage-to-stage hand-offs a pipeline schedule leaves on its critical path: with a P2P delay of c on
every hop between two ranks, small beside a stage's work, the step lasts that many times c longer than with free
hand-offs. The layout search charges a candidate's sends by it (sweep/layouts.py `pipeline_sends_s`).

Closed forms, each the ideal executor's count (schedules/timing.py, held to it in tests/test_schedules.py):

- GPipe, 2(p - 1): every forward runs before any backward, so only the first micro-batch's trip to the last
  stage (p - 1 hops) and the last gradient's trip back (p - 1 hops) wait; every other hand-off arrives while
  its receiver still works through the micro-batches before it.
- 1F1B, 2(m + p - 3 - floor((m - 2) / p)) for m >= 1. Rank r runs w = p - r - 1 warm-up forwards, then
  alternates F(w + j), B(j). Its B(j) waits for F(j) to travel to the last stage and its gradient to return:
  2w hops beside (w + 1) of its own (F, B) pairs, so in the steady state every rank's period T obeys
  (w + 1) T >= (w + 1)(F + B) + 2 w c, tightest on rank 0: T = F + B + 2 (p - 1) c / p, i.e. 2 (p - 1) hops per
  group of p micro-batches. Counting along the longest path: the first micro-batch's round trip (2 (p - 1)
  hops, as in GPipe) carries rank 0 over its warm-up and one pair; then each full group of p of the next
  m - 2 micro-batches adds a round trip, 2 (p - 1) hops, and each micro-batch of the last partial group one hop
  each way: 2 (p - 1)(1 + floor((m - 2) / p)) + 2 ((m - 2) mod p), the form above. For m >> p it tends to
  2 m (p - 1) / p: unlike GPipe, 1F1B's steady state exposes its sends (Megatron-LM hides them only with the
  interleaved schedule's deeper warm-up, below).
- Interleaved 1F1B (v >= 2 chunks per rank, loop placement), 2(p v - 1): rank r warms up with 2 (p - r - 1)
  + (v - 1) p forwards, one more hop each way per rank than its steady state needs, so a hand-off always
  arrives while its receiver runs another chunk; only the fill (the first micro-batch through all p v - 1
  boundaries) and the drain (the last gradient back) wait (Narayanan et al., SC21: the extra warm-up overlaps
  the communication). It holds while a hop is shorter than a chunk's forward.

Any other schedule (zero-bubble, V-shaped, looped BFS, custom tables) is counted by running it on the ideal
executor with equal F, B and W and a hop far shorter than them.
"""

from __future__ import annotations

from functools import lru_cache

from simulator.config.parallelism_options import CUSTOM_SCHEDULE
from simulator.schedules.base import Placement, Schedule
from simulator.schedules.registry import build_schedule
from simulator.schedules.timing import simulate_schedule

_WORK = 2.0**20
"""Each action's duration when a schedule is counted on the ideal executor; the hop is 1, so the makespan's
growth is the hop count exactly (whole numbers far below 2**53)."""


def exposed_hand_offs(name: str, schedule: Schedule, v: int, placement: Placement = "loop") -> int:
    """Hops on the critical path of ``schedule``, the per-rank actions of schedule ``name`` with v chunks per
    rank (``placement``: which virtual stage each chunk holds); 0 without pipelining."""
    p = len(schedule)
    m = sum(1 for action in schedule[0] if action.kind == "F" and action.chunk == 0)
    if p == 1:
        return 0
    if name == "gpipe":
        return 2 * (p - 1)
    if name == "1f1b":
        return 2 * (m + p - 3 - (m - 2) // p)
    if name == "interleaved" and v >= 2 and m % p == 0:
        return 2 * (p * v - 1)
    if name == CUSTOM_SCHEDULE:
        return _count(schedule, v, placement)
    return _named_count(name, p, m, v, placement)


@lru_cache(maxsize=64)
def _named_count(name: str, p: int, m: int, v: int, placement: Placement) -> int:
    """The hop count of a named schedule without a closed form, counted once per shape (a layout search asks
    for the same few many times)."""
    return _count(build_schedule(name, p, m, v), v, placement)


def _count(schedule: Schedule, v: int, placement: Placement) -> int:
    """How much longer the ideal executor runs ``schedule`` with a hop of 1 than with free hops, every action
    lasting ``_WORK``."""
    free = simulate_schedule(schedule, _WORK, _WORK, _WORK, 0.0, v, placement).makespan
    delayed = simulate_schedule(schedule, _WORK, _WORK, _WORK, 1.0, v, placement).makespan
    return round(delayed - free)
