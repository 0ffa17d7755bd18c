"""Pipeline schedules: orders against the reference tables (p = 4, m = 8), bubbles and activations against the
closed forms of published-results.md section 3, the CSV round trip, and the errors users can cause."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest
from shared import DATA, EXACT, REPO

from simulator.errors import ScenarioError, SimulationError
from simulator.schedules import (
    SCHEDULES,
    Action,
    build_schedule,
    format_schedule,
    get_schedule,
    load_schedule_csv,
    parse_action,
    parse_schedule_csv,
    schedule_to_csv,
    simulate_schedule,
)
from simulator.schedules.base import Schedule, placement_of, validate_schedule
from simulator.workload.training import check_schedule_runs

REFERENCE = DATA / "schedules_p4_m8.txt"


def _reference_orders() -> dict[str, dict[int, list[Action]]]:
    """Sections of the reference file, with its notation turned into trainsim's (see the file's header)."""
    sections: dict[str, dict[int, list[Action]]] = {}
    current = ""
    for line in REFERENCE.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = {}
        elif line.startswith("r"):
            rank, cells = line.split(":", 1)
            sections[current][int(rank[1:])] = [_reference_action(cell) for cell in cells.split()]
    return sections


def _reference_action(cell: str) -> Action:
    if cell.startswith("Bi"):
        return parse_action("B" + cell[2:])
    if cell.startswith("B"):
        return parse_action("BW" + cell[1:])
    return parse_action(cell)


REFERENCE_ORDERS = _reference_orders()


@pytest.mark.parametrize("section, name, v", [("1f1b", "1f1b", 1), ("interleaved v=2", "interleaved", 2),
                                              ("zb-h1", "zb-h1", 1)])
def test_orders_equal_reference(section: str, name: str, v: int) -> None:
    schedule = build_schedule(name, 4, 8, v)
    expected = REFERENCE_ORDERS[section]
    assert expected, section
    for rank, actions in expected.items():
        assert schedule[rank] == actions, f"{name} rank {rank}"


def test_reference_makespans_and_gpipe_order() -> None:
    # p = 4, m = 8, F = B = W = 1: 1F1B takes (m + p - 1)(F + B + W) = 33; interleaving v = 2 shrinks the
    # warm-up and cool-down to (p - 1)(F + B + W) / v: 24 + 4.5 = 28.5
    assert simulate_schedule(build_schedule("1f1b", 4, 8), 1, 1, 1).makespan == pytest.approx(11 * 3, abs=EXACT)
    assert simulate_schedule(build_schedule("interleaved", 4, 8, 2), 1, 1, 1).makespan == pytest.approx(
        8 * 3 + 3 * 3 / 2, abs=EXACT)
    gpipe = build_schedule("gpipe", 4, 8)
    assert [str(a) for a in gpipe[2]] == (
        [f"F{i}" for i in range(8)] + [f"BW{i}" for i in range(8)])


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_bubble_fraction_gpipe_1f1b(name: str, p: int) -> None:
    for m in range(p, 4 * p + 1):
        timing = simulate_schedule(build_schedule(name, p, m), f=1, b=2)
        expected = (p - 1) / (m + p - 1)
        assert timing.bubble_fraction == pytest.approx(expected, rel=1e-3), (p, m)
        assert timing.makespan == pytest.approx((m + p - 1) * 3, rel=1e-3)


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("v", [2, 4])
def test_bubble_fraction_interleaved(p: int, v: int) -> None:
    for m in range(p, 4 * p + 1, p):
        timing = simulate_schedule(build_schedule("interleaved", p, m, v), f=1, b=2)
        assert timing.bubble_fraction == pytest.approx((p - 1) / (m * v + p - 1), rel=1e-3), (p, m, v)


def test_interleaved_at_one_chunk_runs_with_1f1bs_bubble_as_the_table_says() -> None:
    """docs/schedules.md's table says what `interleaved` does at v = 1 (ScheduleInterleaved1F1B on one stage per rank,
    1F1B's bubble), not that it needs `v >= 2`, so a sweep over schedules meeting it reads it there."""
    for m in (4, 8):
        timing = simulate_schedule(build_schedule("interleaved", 4, m, 1), f=1, b=2)
        assert timing.bubble_fraction == pytest.approx(3 / (m + 3), rel=1e-9)
    table = (REPO / "docs" / "schedules.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| `interleaved` |"))
    assert "needs `v >= 2`" not in row and "`v = 1`" in row


@pytest.mark.parametrize("p, m, v, percent", [(4, 8, 1, 27.3), (8, 32, 1, 17.9), (8, 128, 1, 5.2),
                                              (8, 32, 2, 9.9), (8, 32, 4, 5.2)])
def test_seed_bubble_figures(p: int, m: int, v: int, percent: float) -> None:
    name = "1f1b" if v == 1 else "interleaved"
    timing = simulate_schedule(build_schedule(name, p, m, v), f=1, b=2)
    assert 100 * timing.bubble_fraction == pytest.approx(percent, abs=0.05)


def test_seed_p4_m8_idle_slots() -> None:
    # F = 1, B = 2 (W folded into B): (m + p - 1)(F + B) = 33, of which every rank idles (p - 1)(F + B) = 9
    timing = simulate_schedule(build_schedule("1f1b", 4, 8), f=1, b=2)
    assert timing.makespan == pytest.approx(11 * 3, abs=EXACT)
    assert timing.idle_per_rank == pytest.approx((3 * 3,) * 4, abs=EXACT)


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("f, b, w", [(1, 1, 1), (1, 1, 0.5), (2, 1.5, 1), (1, 2, 0.25)])
def test_zb_h1_bubble(p: int, f: float, b: float, w: float) -> None:
    """ZB-H1 idles (p-1)(F+B-W) on every rank, vs 1F1B's (p-1)(F+B+W); the closed form holds for m >= p and
    W <= min(F, B), the regime the paper assumes (below it the input-grad chain, (p-1) B, is the floor)."""
    for m in range(p, 4 * p + 1):
        zb = simulate_schedule(build_schedule("zb-h1", p, m), f, b, w)
        assert zb.idle_per_rank == pytest.approx([(p - 1) * (f + b - w)] * p, abs=EXACT), (p, m)
        assert zb.makespan == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w), abs=EXACT)
        one_f_one_b = simulate_schedule(build_schedule("1f1b", p, m), f, b, w)
        assert one_f_one_b.idle_per_rank[0] == pytest.approx((p - 1) * (f + b + w), abs=EXACT)


def test_zb_h1_reference_makespan() -> None:
    timing = simulate_schedule(build_schedule("zb-h1", 4, 8), 1, 1, 1)
    assert timing.makespan == pytest.approx(8 * 3 + 3 * 1, abs=EXACT)  # m (F + B + W) + (p - 1)(F + B - W)


def test_zb_h1_splits_every_backward_of_ranks_past_the_first_when_m_is_under_p() -> None:
    """With m < p the paper's authors' ZB-H1 (sail-sg's Megatron-LM, WeightGradStore) runs every backward of rank
    r > 0 as B with its W deferred (all of them fall in the cool-down, whose W's are popped only from the r-th
    backward on): 1F1B's whole backwards on ranks 1 and 2 (F0 F1 BW0 BW1) give 13 at F = B = W = 1; the split
    gives 11."""
    schedule = build_schedule("zb-h1", 4, 2)
    assert format_schedule(schedule).splitlines() == [
        "r0: F0 F1 BW0 BW1", "r1: F0 F1 B0 B1 W0 W1", "r2: F0 F1 B0 B1 W0 W1", "r3: F0 B0 F1 B1 W0 W1"]
    assert simulate_schedule(schedule, 1, 1, 1).makespan == pytest.approx(11, abs=EXACT)


@pytest.mark.parametrize("p, m", [(4, 8), (8, 32), (3, 2)])
def test_peak_in_flight(p: int, m: int) -> None:
    assert simulate_schedule(build_schedule("1f1b", p, m), 1, 2).peak_in_flight == tuple(
        min(p - r, m) for r in range(p))
    assert simulate_schedule(build_schedule("zb-h1", p, m), 1, 1, 1).peak_in_flight == tuple(
        min(p - r, m) for r in range(p))
    assert simulate_schedule(build_schedule("gpipe", p, m), 1, 2).peak_in_flight == (m,) * p


def test_interleaved_peak_in_flight_reference() -> None:
    timing = simulate_schedule(build_schedule("interleaved", 4, 8, 2), 1, 2)
    assert timing.peak_in_flight == (11, 9, 7, 5)


def test_dependencies_hold_in_timeline() -> None:
    """Every forward starts after the previous virtual stage's forward ends plus the P2P delay."""
    p, v, p2p = 4, 2, 0.1
    timing = simulate_schedule(build_schedule("interleaved", p, 8, v), 1, 2, p2p=p2p)
    forward_end = {(t.action.microbatch, t.action.chunk * p + r): t.end
                   for r, rank in enumerate(timing.timeline) for t in rank if t.action.kind == "F"}
    for r, rank in enumerate(timing.timeline):
        for t in rank:
            stage = t.action.chunk * p + r
            if t.action.kind == "F" and stage > 0:
                assert t.start >= forward_end[(t.action.microbatch, stage - 1)] + p2p - EXACT
    no_p2p = simulate_schedule(build_schedule("interleaved", p, 8, v), 1, 2)
    assert timing.makespan > no_p2p.makespan


def test_action_str_and_parse() -> None:
    assert str(Action("F", 3)) == "F3"
    assert str(Action("B", 0, 1)) == "B0c1"
    assert str(Action("W", 5)) == "W5"
    assert str(Action("BW", 2)) == "BW2"
    for text in ("F3", "B0c1", "W5", "BW2", "F7c3"):
        assert str(parse_action(text)) == text
    with pytest.raises(ValueError):
        parse_action("X1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Action("F", 1).microbatch = 2  # type: ignore[misc]


@pytest.mark.parametrize("name, v", [("zb-h1", 1), ("interleaved", 2), ("1f1b", 1)])
def test_custom_csv_round_trip(tmp_path: Path, name: str, v: int) -> None:
    schedule = build_schedule(name, 4, 8, v)
    path = tmp_path / "table.csv"
    path.write_text("# my schedule\n" + schedule_to_csv(schedule))
    assert load_schedule_csv(path) == schedule
    assert load_schedule_csv(path).placement == schedule.placement == "loop"
    custom = get_schedule("custom", table=path)
    assert custom(4, 8, v) == schedule
    assert placement_of(custom(4, 8, v)) == "loop"
    with pytest.raises(ScenarioError, match="table is for p = 4"):
        custom(4, 16, v)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_schedule_pickles_with_its_placement_under_every_protocol(protocol: int) -> None:
    """A list subclass with ``__slots__`` pickles under protocols 0 and 1 too (a process pool may pickle either
    way), and its placement comes back, as ``==`` does not compare it."""
    schedule = build_schedule("dualpipev", 2, 4, 2)
    copied = pickle.loads(pickle.dumps(schedule, protocol))
    assert isinstance(copied, Schedule)
    assert (copied, copied.placement) == (schedule, "v")


def test_a_schedules_repr_names_its_placement() -> None:
    """Two schedules equal as lists but placed apart print apart."""
    actions = [[Action("F", 0), Action("F", 0, 1), Action("BW", 0, 1), Action("BW", 0)]]
    assert repr(Schedule(actions, "v")) == f"Schedule({actions!r}, placement='v')"
    assert repr(Schedule(actions)).endswith(", placement='loop')")


def test_custom_csv_errors(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="'Q1' is not an action") as caught:
        parse_schedule_csv("F0,BW0\nF0,Q1\n", source="t.csv")
    assert caught.value.line == 2 and caught.value.file == "t.csv"
    with pytest.raises(ScenarioError, match="needs BW1, or both B1 and W1"):
        parse_schedule_csv("F0,F1,BW0\nF0,BW0,F1,BW1\n")
    with pytest.raises(ScenarioError, match="W0 before B0"):
        parse_schedule_csv("F0,W0,B0\nF0,BW0\n")
    with pytest.raises(ScenarioError, match="cannot read"):
        load_schedule_csv(tmp_path / "missing.csv")
    with pytest.raises(ScenarioError, match="needs a CSV action table"):
        get_schedule("custom")


def test_a_table_of_other_sizes_names_the_fields_that_give_its_sizes(tmp_path: Path) -> None:
    """schedules.md's DualPipeV table (p = 2, m = 4, v = 2) beside a Llama-3-8B step of global batch 16 at dp 1,
    micro-batch 1 (m = 16) is refused naming each field that sets the sizes and the table's value for it, not only
    'allowed: a table matching the pipeline sizes'."""
    path = tmp_path / "dualpipev.csv"
    path.write_text(schedule_to_csv(build_schedule("dualpipev", 2, 4, 2), "v"))
    with pytest.raises(ScenarioError) as caught:
        get_schedule("custom", table=path)(2, 16, 2)
    assert caught.value.problem == (f"the schedule table is for p = 2, m = 4, v = 2 ({path}, its rows on lines 2-3); "
                                    "the scenario asks for p = 2, m = 16, v = 2")
    assert caught.value.file == ""  # the scenario's table line locates it
    assert caught.value.allowed == ("parallelism.pp: 2, 4 micro-batches (training.microbatches, or a global_batch of "
                                    "dp x micro_batch x 4) and parallelism.pipeline.virtual_stages: 2; or a table "
                                    "for p = 2, m = 16, v = 2")


def test_deadlock_names_ranks() -> None:
    table = parse_schedule_csv("F0,BW0,F1,BW1\nF1,F0,BW0,BW1\n")
    with pytest.raises(SimulationError, match=r"rank 0 at BW0; rank 1 at F1"):
        simulate_schedule(table, 1, 2)


def test_a_deadlocked_table_is_refused_at_a_row_of_its_wait_cycle(tmp_path: Path) -> None:
    """Only rows 3 and 4 of this p = 4 table disagree: rank 2 runs BW0 before F1, and rank 3 F1 before BW0, so
    rank 2's BW0 waits for rank 3's BW0, behind rank 3's F1, which waits for rank 2's F1, behind rank 2's BW0.
    Ranks 0 and 1 are stuck at BW0 too, but only wait down the chain (rank 0 for rank 1, rank 1 for rank 2):
    the refusal names the row of the cycle's lowest rank, 2 (line 3), not rank 0's line 1. A rank waiting for
    its own later action (F0c1 before F0 at p = 1) is a cycle of one."""
    table = tmp_path / "dl4.csv"
    table.write_text("F0,F1,BW0,BW1\nF0,F1,BW0,BW1\nF0,BW0,F1,BW1\nF0,F1,BW1,BW0\n")
    with pytest.raises(ScenarioError) as caught:
        check_schedule_runs(load_schedule_csv(table), "loop", table)
    assert caught.value.line == 3
    assert caught.value.problem == ("the schedule cannot run: pipeline schedule deadlocks in the loop placement: no "
                                    "action can start (rank 0 at BW0; rank 1 at BW0; rank 2 at BW0; rank 3 at F1); "
                                    "rank 2's BW0 waits for rank 3's BW0, and rank 3's F1 for rank 2's F1")
    table.write_text("F0c1,F0,BW0c1,BW0\n")
    with pytest.raises(ScenarioError) as caught:
        check_schedule_runs(load_schedule_csv(table), "loop", table)
    assert caught.value.problem.endswith("(rank 0 at F0c1); rank 0's F0c1 waits for rank 0's F0")


def _accepts(name: str, p: int, m: int) -> bool:
    """Whether ``name`` builds at p ranks and m micro-batches, two chunks per rank."""
    try:
        build_schedule(name, p, m, 2)
    except ScenarioError:
        return False
    return True


def test_unknown_schedule_and_bad_sizes() -> None:
    with pytest.raises(ScenarioError) as caught:
        get_schedule("pipedream")
    assert caught.value.field == "parallelism.pipeline.schedule"
    assert caught.value.problem == "unknown schedule 'pipedream'"
    assert caught.value.allowed == "gpipe, 1f1b, interleaved, zb-h1, interleaved-zb, looped-bfs, zbv, dualpipev, custom"
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved", "zb-h1", "interleaved-zb", "looped-bfs", "zbv",
                              "dualpipev"}
    # PyTorch's rounds rule: m a multiple of max(1, m // p), 2 rounds at p = 4, m = 9 (m = 6 runs in one round);
    # the refusal names the nearest counts the rule accepts: 1-8, 10, 12, 15, 16 and multiples of 4 at p = 4
    accepted = [m for m in range(1, 41) if _accepts("interleaved", 4, m)]
    assert accepted == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 16, 20, 24, 28, 32, 36, 40]
    for m, below, above in ((9, 8, 10), (13, 12, 15), (14, 12, 15), (18, 16, 20), (17, 16, 20)):
        with pytest.raises(ScenarioError) as caught:
            build_schedule("interleaved", 4, m, 2)
        assert caught.value.allowed == (f"{below} or {above} (m a multiple of max(1, m // p) rounds, PyTorch's rule); "
                                        "a multiple of p = 4 for Megatron-LM's order")
    with pytest.raises(ScenarioError, match="two chunks per rank"):
        build_schedule("zbv", 4, 8, 1)
    with pytest.raises(ScenarioError, match="one chunk per rank"):
        build_schedule("1f1b", 4, 8, 2)
    for p, m, v in ((0, 8, 1), (4, 0, 1), (4, 8, 0), (-1, 8, 1)):
        for name in ("gpipe", "1f1b", "zb-h1", "interleaved"):
            with pytest.raises(ScenarioError, match=">= 1"):
                build_schedule(name, p, m, v)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "interleaved"])
def test_schedules_complete_for_small_sizes(name: str) -> None:
    """Every valid (p, m, v), including m < p and p = 1, gives a complete, deadlock-free order with busy time
    m(F+B+W) per rank."""
    for p in range(1, 6):
        for m in range(1, 9):
            for v in ((2, 3) if name == "interleaved" else (1,)):
                if name == "interleaved" and m % p:
                    continue
                schedule = build_schedule(name, p, m, v)
                validate_schedule(schedule, p, m, v)
                timing = simulate_schedule(schedule, 1, 2, 0.5)
                for rank, idle in enumerate(timing.idle_per_rank):
                    assert timing.makespan - idle == pytest.approx(m * 3.5, abs=EXACT), (p, m, v, rank)


def test_custom_csv_skips_a_row_of_commas_and_a_byte_order_mark() -> None:
    """A spreadsheet saves blank rows as commas and UTF-8 with a BOM; the load skips both (not IndexError, nor
    "'\ufeffF0' is not an action")."""
    table = parse_schedule_csv("\ufeffF0,F1,BW0,BW1\n,,,\nF0,B0,F1,B1,W0,W1\n")
    assert table == [parse_schedule_csv("F0,F1,BW0,BW1\nF0,B0,F1,B1,W0,W1\n")[0],
                     [parse_action(word) for word in "F0 B0 F1 B1 W0 W1".split()]]
    # F = B = W = 1: rank 1 starts after rank 0's F0, then runs its six actions back to back: 1 + 6 = 7
    assert simulate_schedule(table, f=1, b=1, w=1).makespan == pytest.approx(7, rel=EXACT)


def test_a_table_with_a_huge_micro_batch_index_is_refused_at_once() -> None:
    """The largest index sets m = 10**8: the check names the first micro-batch missing instead of walking m."""
    with pytest.raises(ScenarioError) as caught:
        parse_schedule_csv("F99999999,BW99999999\nF99999999,BW99999999\n", source="t.csv")
    assert caught.value.problem == ("rank 0 runs no action of micro-batch 0, though F99999999 on line 1 makes the "
                                    "table 100000000 micro-batches (its largest micro-batch + 1)")
    assert caught.value.line == 1


def test_a_stray_chunk_index_is_named_where_it_sets_the_tables_chunks(tmp_path: Path) -> None:
    """A table's v is its largest chunk + 1 (as its m is its largest micro-batch + 1): a typo `W1c5` on rank 1's
    row makes 6 chunks per rank, and the refusal names the action and the line that set it, prefixed with that
    line, its own row running no chunk 1 either (rank 0's line 2 is right); a row
    that misses a chunk the others run is the one refused."""
    with pytest.raises(ScenarioError) as caught:
        parse_schedule_csv("# p = 2\nF0,F1,BW0,BW1\nF0,B0,F1,B1,W0,W1c5\n", source="t.csv")
    assert str(caught.value) == ("t.csv:3: parallelism.pipeline.table: rank 1 runs no action of chunk 1, though "
                                 "W1c5 on line 3 makes the table 6 chunks per rank (its largest chunk + 1) (allowed: "
                                 "F, then BW or B ... W, for every micro-batch and chunk; the largest micro-batch "
                                 "and chunk + 1 set m and v)")
    with pytest.raises(ScenarioError) as caught:
        parse_schedule_csv("F0,F1,BW0,BW1\nF0,BW0,F1,BW1\nF0,BW0,F1,BW1c1\n")
    assert caught.value.problem == ("rank 0 runs no action of chunk 1, though BW1c1 on line 3 makes the table 2 "
                                    "chunks per rank (its largest chunk + 1)")
    assert caught.value.line == 1


def test_a_placement_row_after_the_first_row_is_refused_as_such() -> None:
    """`placement,v` is the table's first row or none: later, it is refused as a misplaced placement row, not as
    "'placement' is not an action"; a second one too."""
    with pytest.raises(ScenarioError) as caught:
        parse_schedule_csv("F0,F1,BW0,BW1\nplacement,v\nF0,F1,BW0,BW1\n", source="t.csv")
    assert str(caught.value) == ("t.csv:2: parallelism.pipeline.table: the placement row must be the table's first "
                                 "row; rank 0's row on line 1 comes before it (allowed: one row placement,loop or "
                                 "placement,v, before the ranks' rows)")
    with pytest.raises(ScenarioError, match="one on line 1 comes before it") as caught:
        parse_schedule_csv("placement,v\n# again\nplacement,v\nF0,F1,BW0,BW1\nF0,F1,BW0,BW1\n")
    assert caught.value.line == 3


def test_a_table_reads_cells_in_either_case_quoted_and_spaced(tmp_path: Path) -> None:
    """schedules.md: cells are CSV (quotes allowed), stripped of spaces and read in either case, the placement
    row's too (`placement,V`, as the docs name the V placement)."""
    path = tmp_path / "dualpipev.csv"
    text = schedule_to_csv(build_schedule("dualpipev", 2, 4, 2), "v")
    lenient = text.lower().replace("placement,v", "Placement, V").replace("\nf0,f1,", '\n"f0", F1 ,')
    assert lenient.startswith('Placement, V\n"f0", F1 ,f2,')
    path.write_text(lenient)
    assert load_schedule_csv(path) == build_schedule("dualpipev", 2, 4, 2)
    assert load_schedule_csv(path).placement == "v"


def test_a_table_given_with_another_schedule_is_refused() -> None:
    from simulator.config.loader import scenario_from_text

    text = ("cluster: {topology: dgx-h100}\nmodel: {synthetic: {stages: 2, forward: 1 ms, backward: 2 ms}}\n"
            "training: {microbatches: 2}\nparallelism:\n  pp: 2\n  pipeline: {schedule: 1f1b, table: t.csv}\n")
    with pytest.raises(ScenarioError) as caught:
        scenario_from_text(text, source="s.yaml")
    assert str(caught.value) == ("s.yaml:6: parallelism.pipeline.table: a schedule table is read only by schedule "
                                 "'custom', not '1f1b' (allowed: schedule: custom with the table, or no table)")


def _exposed_hand_offs(name: str, p: int, m: int, v: int) -> int:
    """Hops on a schedule's critical path with a hop short beside a chunk's work, by closed form. GPipe 2(p - 1):
    only the first micro-batch's trip to the last stage and the last gradient's trip back wait. 1F1B
    2(m + p - 3 - floor((m - 2) / p)): rank r's B(j) waits for F(j) to reach the last stage and its gradient to
    return, 2(p - 1 - r) hops beside p - r of its own pairs, so rank 0's steady state waits for a round trip
    per group of p micro-batches, after the first micro-batch's round trip, and each micro-batch of the last
    partial group adds a hop each way. Interleaved 2(p v - 1): its deeper warm-up (one more forward per rank
    than the steady state needs) hides every hand-off but the fill's and the drain's."""
    if name == "gpipe":
        return 2 * (p - 1)
    if name == "1f1b":
        return 2 * (m + p - 3 - (m - 2) // p)
    return 2 * (p * v - 1)


def test_1f1b_p4_m8_exposes_16_hand_offs() -> None:
    """1F1B with p 4 and m 8 exposes two round trips of 6 hops and the partial group's 2 hops, 16 hops in all
    (hand-counted): the ideal executor with a hop of 1 ms runs 16 ms longer than with free hops."""
    schedule = build_schedule("1f1b", 4, 8, 1)
    grown = (simulate_schedule(schedule, 1.0, 2.0, p2p=1e-3).makespan - simulate_schedule(schedule, 1.0, 2.0).makespan)
    assert grown == pytest.approx(16e-3, rel=1e-9)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved"])
def test_the_ideal_executor_exposes_the_closed_forms_hand_offs(name: str) -> None:
    """With a hop of c the ideal executor runs longer than with free hops by the closed form's count of hops
    times c, whatever the forward, backward and hop (while the hop is short beside a chunk's work)."""
    for v in ((1,) if name != "interleaved" else (2, 4)):
        for p in range(2, 9):
            for m in range(1, 3 * p + 3):
                if name == "interleaved" and m % p:
                    continue
                schedule = build_schedule(name, p, m, v)
                hops = _exposed_hand_offs(name, p, m, v)
                for f, b, c in ((1.0, 2.0, 1e-3), (1.0, 3.0, 0.05)):
                    grown = (simulate_schedule(schedule, f, b, p2p=c, v=v).makespan
                             - simulate_schedule(schedule, f, b, v=v).makespan)
                    assert grown == pytest.approx(hops * c, rel=1e-9), (p, m, v, f, b, c)


def _timeline(timing) -> list[list[tuple[str, float, float]]]:
    return [[(str(t.action), t.start, t.end) for t in rank] for rank in timing.timeline]


def test_unequal_stages_run_as_timed_by_hand() -> None:
    """Each virtual stage's own durations, hop 0.5. 1F1B, p 2, m 2, forwards 1 and 2, backwards 2 and 4: rank 1's
    F0 waits for rank 0's (ends 1) and the hop: 1.5 to 3.5, its BW0 3.5 to 7.5, F1 (input there at 2.5) 7.5 to
    9.5, BW1 to 13.5; rank 0's BW0 waits for rank 1's and the hop, 8 to 10, its BW1 14 to 16. ZB-H1 with input
    grads 1 and 3 and weight grads 1 and 2: rank 1 runs F0 1.5-3.5, B0 3.5-6.5, F1 6.5-8.5, B1 8.5-11.5, then its
    W0 and W1 to 15.5, while rank 0's BW0 (2) starts at 7 and BW1 at 12: 15.5, where 1F1B's order of the same
    work holds rank 1's weight grads in its BW0 (3.5 to 8.5) and BW1 (10.5 to 15.5), so rank 0's BW1 runs
    16 to 18. ZBV (V placement, stages 0 to 3 on ranks 0, 1, 1, 0) with forwards and input grads 1, 1,
    2, 2 and weight grads 1: rank 1's turn from stage 1 to 2 is free, rank 0's F0c1 (stage 3) waits for it and
    the hop, 4.5 + 0.5."""
    one_f_one_b = simulate_schedule(build_schedule("1f1b", 2, 2), [1, 2], [2, 4], p2p=0.5)
    assert _timeline(one_f_one_b) == [
        [("F0", 0.0, 1.0), ("F1", 1.0, 2.0), ("BW0", 8.0, 10.0), ("BW1", 14.0, 16.0)],
        [("F0", 1.5, 3.5), ("BW0", 3.5, 7.5), ("F1", 7.5, 9.5), ("BW1", 9.5, 13.5)]]
    assert one_f_one_b.makespan == 16.0
    zb = simulate_schedule(build_schedule("zb-h1", 2, 2), [1, 2], [1, 3], [1, 2], p2p=0.5)
    assert _timeline(zb) == [
        [("F0", 0.0, 1.0), ("F1", 1.0, 2.0), ("BW0", 7.0, 9.0), ("BW1", 12.0, 14.0)],
        [("F0", 1.5, 3.5), ("B0", 3.5, 6.5), ("F1", 6.5, 8.5), ("B1", 8.5, 11.5), ("W0", 11.5, 13.5),
         ("W1", 13.5, 15.5)]]
    assert simulate_schedule(build_schedule("1f1b", 2, 2), [1, 2], [1, 3], [1, 2], p2p=0.5).makespan == 18.0
    zbv = simulate_schedule(build_schedule("zbv", 2, 2, 2), [1, 1, 2, 2], [1, 1, 2, 2], [1, 1, 1, 1], p2p=0.5,
                            placement="v")
    assert _timeline(zbv)[1][:2] == [("F0", 1.5, 2.5), ("F0c1", 2.5, 4.5)]
    assert _timeline(zbv)[0][2] == ("F0c1", 5.0, 7.0)


def test_equal_stage_lists_run_as_the_stage_duration_split_over_chunks() -> None:
    """A duration per stage is split over its v chunks: the same as each virtual stage's own duration 1/v of it;
    a list that is not one per virtual stage, or a negative duration, is refused."""
    schedule = build_schedule("interleaved-zb", 4, 8, 2)
    split = simulate_schedule(schedule, 2.0, 3.0, 1.0, p2p=0.25)
    listed = simulate_schedule(schedule, [1.0] * 8, [1.5] * 8, [0.5] * 8, p2p=0.25)
    assert listed.timeline == split.timeline
    with pytest.raises(ValueError, match="f gives 4 durations; the schedule has 8 virtual stages"):
        simulate_schedule(schedule, [1.0] * 4, 1.0)
    with pytest.raises(ValueError, match="duration w must be >= 0, got -1"):
        simulate_schedule(schedule, 1.0, 1.0, [1.0] * 7 + [-1.0])


@pytest.mark.parametrize(("name", "p", "m", "v", "chunks"), [
    ("1f1b", 4, 8, 1, [4, 3, 2, 1]),  # min(m, p - r)
    ("1f1b", 4, 2, 1, [2, 2, 2, 1]),
    ("gpipe", 4, 8, 1, [8] * 4),  # m
    ("interleaved", 4, 8, 2, [11, 9, 7, 5]),  # min(2(p-r-1) + (v-1)p + 1, m v)
    ("interleaved", 4, 4, 2, [8] * 4),  # m v at m = p
    ("dualpipev", 4, 8, 2, [9] * 4),  # 2p + 1 on every rank
])
def test_a_synthetic_step_reports_its_schedules_in_flight_micro_batches(name: str, p: int, m: int, v: int,
                                                                        chunks: list[int]) -> None:
    """A synthetic step holds no bytes, but `memory_per_stage[].in_flight_microbatches` still counts what its
    schedule keeps in flight at the peak, in micro-batches' worth (chunks / v), by the closed forms of
    docs/schedules.md: 0.0, as a count, would read as a schedule that holds nothing."""
    from simulator.config.loader import scenario_from_text
    from simulator.topology.loader import scenario_topology
    from simulator.workload.memory_plan import step_memory
    from simulator.workload.training import build_training_step

    text = (f"cluster: {{topology: dgx-h100}}\nmodel: {{synthetic: {{stages: {p}, forward: 1 ms, "
            f"backward: 2 ms}}}}\ntraining: {{microbatches: {m}}}\nparallelism: {{pp: {p}, dp: {8 // p}, "
            f"pipeline: {{schedule: {name}, virtual_stages: {v}}}}}\n")
    loaded = scenario_from_text(text, "inline.yaml", [])
    memory = step_memory(loaded.scenario, build_training_step(loaded.scenario, scenario_topology(loaded)))
    assert [entry["in_flight_microbatches"] for entry in memory["memory_per_stage"]] == [c / v for c in chunks]
    assert all(entry["total_gib"] == 0.0 for entry in memory["memory_per_stage"])


def test_the_rounds_refusal_names_global_batches_where_the_scenario_set_one() -> None:
    """A scenario that set global_batch is told global batches, one that set microbatches counts: Llama 3 8B at
    pp 4, dp 2, micro_batch 2 with global_batch 36 runs m = 36 / (2 x 2) = 9, two rounds of 4.5 at p = 4; the
    rule takes m = 8 or 10, global_batch 8 x 4 = 32 or 10 x 4 = 40, and Megatron-LM's order multiples of
    p x micro_batch x dp = 16."""
    from simulator.config.loader import load_scenario
    from simulator.topology.loader import scenario_topology
    from simulator.workload.training import build_training_step

    layout = ["parallelism.pp=4", "parallelism.dp=2", "parallelism.pipeline.schedule=interleaved",
              "parallelism.pipeline.virtual_stages=2", "training.micro_batch=2"]
    for setting, field, allowed in (
            ("training.global_batch=36", "training.global_batch",
             "global_batch 32 or 40 (m = 8 or 10: a multiple of max(1, m // p) rounds, PyTorch's rule); a multiple "
             "of p x micro_batch x dp = 16 for Megatron-LM's order"),
            ("training.microbatches=9", "training.microbatches",
             "8 or 10 (m a multiple of max(1, m // p) rounds, PyTorch's rule); a multiple of p = 4 for Megatron-LM's "
             "order")):
        loaded = load_scenario("llama3-8b-dgx-h100-dp8", [*layout, setting])
        with pytest.raises(ScenarioError) as caught:
            build_training_step(loaded.scenario, scenario_topology(loaded))
        assert (caught.value.field, caught.value.allowed) == (field, allowed)
