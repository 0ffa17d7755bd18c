"""The option sets of the `parallelism:` section that name code elsewhere, each defined once: the schema checks a
scenario against them at load, and schedules/registry.py and parallel/context.py key their code by them. Kept
here so that reading a scenario does not load the schedules or the parallel layer."""

from __future__ import annotations

from typing import Final, Literal, get_args

CUSTOM_SCHEDULE: Final = "custom"
"""The schedule read from a CSV action table (`parallelism.pipeline.table`)."""
BuiltinSchedule = Literal["gpipe", "1f1b", "interleaved", "zb-h1", "interleaved-zb", "looped-bfs", "zbv",
                          "dualpipev"]
"""The schedules written in code (schedules/registry.py SCHEDULES, in its order)."""
SCHEDULE_NAMES: tuple[str, ...] = (*get_args(BuiltinSchedule), CUSTOM_SCHEDULE)
"""Every name `parallelism.pipeline.schedule` accepts."""
SCHEDULE_FIELD: Final = "parallelism.pipeline.schedule"
VIRTUAL_STAGES_FIELD: Final = "parallelism.pipeline.virtual_stages"

CpAlgorithm = Literal["ring", "all_gather"]
"""How a CP rank gets the sequence's K/V (`parallelism.cp_algorithm`; parallel/context.py)."""
