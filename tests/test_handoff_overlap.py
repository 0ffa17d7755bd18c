"""Which actions of a pipeline schedule run beside a hand-off of their rank (schedules/handoff_overlap.py), against
what the built programs' ordering finds (the scale estimate's ratios in tests/test_scale.py)."""

from __future__ import annotations

import pytest

from simulator.schedules.handoff_overlap import beside_handoffs
from simulator.schedules.registry import build_schedule, schedule_placement


def _marked(name: str, p: int, m: int, v: int = 1) -> list[str]:
    """Each rank's actions, those beside a hand-off marked with '*'."""
    schedule = build_schedule(name, p, m, v)
    flags = beside_handoffs(schedule, v, schedule_placement(name))
    return [" ".join(f"{action}{'*' if beside else ''}" for action, beside in zip(actions, row, strict=True))
            for actions, row in zip(schedule, flags, strict=True)]


@pytest.mark.parametrize("name, p, m, v, marked", [
    ("1f1b", 4, 1, 1, ["F0 BW0"] * 4),
    ("1f1b", 2, 2, 1, ["F0 F1* BW0* BW1", "F0* BW0* F1* BW1*"]),
    ("gpipe", 2, 2, 1, ["F0 F1* BW0* BW1", "F0* F1 BW0 BW1*"]),
    ("1f1b", 4, 4, 1, ["F0 F1* F2* F3* BW0* BW1* BW2* BW3",
                       "F0* F1* F2* BW0* F3* BW1* BW2* BW3*",
                       "F0* F1* BW0* F2* BW1* F3* BW2* BW3*",
                       "F0* BW0* F1* BW1* F2* BW2* F3* BW3*"]),
    ("interleaved", 2, 2, 2, ["F0 F1* F0c1* F1c1* BW0c1* BW1c1* BW0* BW1",
                              "F0* F1* F0c1* F1c1 BW0c1 BW1c1* BW0* BW1*"]),
    ("zbv", 2, 2, 2, ["F0 F1* F0c1* B0c1* W0c1* F1c1* B1c1* W1c1* B0* W0* B1 W1",
                      "F0* F0c1* F1* F1c1* B0c1* W0c1* B0* W0* B1c1* W1c1* B1* W1*"]),
    ("dualpipev", 2, 4, 2, ["F0 F1* F2* F0c1* B0c1* W0c1* F1c1* F3* BW1c1* F2c1* BW0* BW2c1* F3c1* BW1* BW3c1* B2* "
                            "W2* B3 W3",
                            "F0* F0c1* F1* F1c1* F2* BW0c1* F2c1* BW0* F3* BW1c1* F3c1* BW1* BW2c1* BW2* B3c1* B3* "
                            "W3c1* W3*"]),
])
def test_an_action_runs_beside_a_handoff_unless_the_waits_order_them(name, p, m, v, marked):
    """With one micro-batch the stages run one after the other: every hand-off ends before the action that
    receives it and starts after the one that produces it, so no action runs beside one. With more, the first
    stage's first forward runs before any hand-off and its last backward after all of them; under GPipe, and
    interleaved on two ranks (the last stage is rank 1's chunk 1), the last stage's last forward and first
    backward run while the pipeline is drained too (its forwards all received, no gradient sent yet). In the V
    placement (ZBV, DualPipeV) rank 0 holds the first and the last stage: its first forward runs before any
    hand-off and the first stage's last backward and weight gradient after all of them. The 1F1B
    and GPipe rows at two stages are those the SC21 7.5B step's run at TP 16 and PP 2 replays alone
    (engine/sharing.py)."""
    assert _marked(name, p, m, v) == marked
