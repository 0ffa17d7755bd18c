"""Pipeline schedules: pure functions giving each pipeline rank its ordered F/B/W actions, found by name."""

from simulator.schedules.base import Action, Schedule, ScheduleBuilder, format_schedule, parse_action
from simulator.schedules.custom_csv import load_schedule_csv, parse_schedule_csv, schedule_to_csv
from simulator.schedules.registry import SCHEDULES, build_schedule, get_schedule, schedule_names
from simulator.schedules.timing import ScheduleTiming, TimedAction, simulate_schedule

__all__ = [
    "SCHEDULES",
    "Action",
    "Schedule",
    "ScheduleBuilder",
    "ScheduleTiming",
    "TimedAction",
    "build_schedule",
    "format_schedule",
    "get_schedule",
    "load_schedule_csv",
    "parse_action",
    "parse_schedule_csv",
    "schedule_names",
    "schedule_to_csv",
    "simulate_schedule",
]
