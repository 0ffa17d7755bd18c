"""Small integer ids for process groups, so that a group of 16,384 ranks is hashed once, not once per op.

Python does not cache the hash of a tuple: every dict lookup keyed by a group costs O(group size), and doing
it per member op makes a collective over N ranks cost O(N^2). The id is looked up by object identity first
and the tuple is hashed only for an object not seen before: the ops of one group carry only a few tuple objects
among them in most programs (the long-context run's engine meets 2,032 objects for its 80 groups). Any tuple
that ops share as one object works alike: `engine/shapes.py` and `engine/engine.py` name the pair sizes of
uneven all-to-alls (an ep x ep matrix an op) this way too.
"""

from __future__ import annotations


class GroupIds:
    """Maps tuples (groups, pair-size matrices) to dense ids 0, 1, ... (equal tuples get the same id)."""

    def __init__(self) -> None:
        self._by_object: dict[int, tuple[tuple, int]] = {}
        self._by_value: dict[tuple, int] = {}

    def id(self, values: tuple) -> int:
        """The id of ``values`` (a group or a pair-size matrix); the tuple is kept referenced so that its object
        id stays unique."""
        entry = self._by_object.get(id(values))
        if entry is None:
            gid = self._by_value.get(values)
            if gid is None:
                gid = self._by_value[values] = len(self._by_value)
            entry = self._by_object[id(values)] = (values, gid)
        return entry[1]
