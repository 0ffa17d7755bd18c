"""Rank folding's representatives and mirror groups on a small layout, checked by hand."""

from __future__ import annotations

from simulator.parallel.folding import mirror_images, representatives
from simulator.parallel.layout import Layout

LAYOUT = Layout(tp=2, cp=1, pp=2, dp=2)  # rank = tp + 2 * pp + 4 * dp


def test_one_representative_per_stage_when_folded():
    assert representatives(LAYOUT, fold=True) == [0, 2]
    assert representatives(LAYOUT, fold=False) == list(range(8))


def test_dp_group_mirrors_are_the_other_tp_lanes_of_the_stage():
    dp_group = LAYOUT.group("dp", 0)
    assert dp_group == (0, 4)
    assert mirror_images(LAYOUT, dp_group) == ((1, 5),)


def test_tp_group_mirrors_are_the_other_replicas_and_p2p_pairs_keep_direction():
    assert mirror_images(LAYOUT, LAYOUT.group("tp", 2)) == ((6, 7),)
    assert mirror_images(LAYOUT, (0, 2)) == ((1, 3), (4, 6), (5, 7))
    assert mirror_images(LAYOUT, (2, 0)) == ((3, 1), (6, 4), (7, 5))
