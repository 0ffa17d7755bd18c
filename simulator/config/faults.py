"""The `faults:` section: what goes wrong inside one simulated step and over a job's horizon.

`faults.step` perturbs the engine's run of a step (stragglers, degraded or failed links, failed GPUs);
the other fields describe failure processes of the cluster's components over weeks, for the job simulation.
"""

from __future__ import annotations

from simulator.config.sections import Section


class StepFaults(Section):
    """Faults inside one simulated step."""


class FaultsConfig(Section):
    """Faults of a scenario: inside a step (`step`) and over the job's horizon."""

    step: StepFaults = StepFaults()
