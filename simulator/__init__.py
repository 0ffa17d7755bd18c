"""trainsim: a discrete-event simulator of GPU clusters training large models.

Public API: `load_scenario(path, overrides)` reads and validates a scenario file; `simulate(loaded)` runs it
and returns a `Result` with the summary, the topology and the event log (its `timeline` DataFrame built on
first use); a job scenario (`run.horizon`) runs with `simulator.reliability.simulate.simulate_job(loaded)`, and
`simulate()` of one runs its step alone and warns so. Imported lazily so that
`import simulator.units` stays light.
"""

__all__ = ["Result", "load_scenario", "simulate"]


def __getattr__(name: str):
    if name == "load_scenario":
        from simulator.config.loader import load_scenario

        return load_scenario
    if name in ("simulate", "Result"):
        from simulator import simulation

        return getattr(simulation, name)
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")
