"""Python's cyclic garbage collector paused while a simulation runs.

A run keeps a large heap alive (the cluster's wiring and routes, the step program, the event log) that every
full collection walks again, while it makes almost no garbage in cycles: on the 405B 8,192-GPU step the ten
full collections cost about a fifth of `simulate()`'s CPU and found 20 objects (all collections together
about 1,300); on the 16,384-GPU job they cost 1.4-2.8 s of 9-12 s CPU, and pausing them there adds about
50 MiB to the peak memory. Reference counting still frees everything else as it goes.

The pause is taken once, by decorating the entry points: `simulate()`, `simulate_job()` and `prepare_job()`
(the library's; a study prepares each point's job before any runs),
`collective_sweep()` (`trainsim collective`), `preflight.validate()` (`trainsim validate`, which builds the same
program: on the SC21 1T row its collections cost about a quarter of the CPU) and `trainsim run`, which also loads
the scenario and writes the outputs with the run's heap alive. What runs beneath them (`run_ops`, the job's event
table) needs no pause of its own; a pause inside another one changes nothing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the duration (and back on after, if it was on); also a function
    decorator, `@collector_paused()`."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
