"""What SGLang did to its waiting list since Feather last looked, without reading every entry.

Between two admission passes SGLang changes its waiting list in two usual ways
(python/sglang/srt/managers/scheduler.py, 0.5.x): the requests the last pass admitted leave
(`self.waiting_queue = [x for x in self.waiting_queue if x not in can_run_set]`), and new
or retracted requests are appended (`_add_request_to_queue`, `waiting_queue.extend`). Feather's
admissions were its candidates, which it had moved to the head of the list in the order it
admitted them. So the list the next pass sees is, in the usual case, the last pass's list
without its first k entries, plus a tail. One comparison by identity (C speed, a few ns an
entry) confirms it, and only the tail needs Python work; anything else (an abort, a re-sort,
a skipped request) fails the comparison and the caller diffs the whole list by request id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ListSnapshot", "move"]


def move(entries: list, j: int, slot: int) -> None:
    """Move entry `j` to position `slot` (<= j), shifting the ones between by one.

    Two ways, the cheaper for the distance: a slice assignment of equal length touches only
    the j - slot + 1 references between, but each with its reference count (~4 ns an entry
    on the dev VM); pop(j) then insert(slot) shift the tails behind j and slot with a plain
    memmove (~0.25 ns an entry) whatever the distance. At 10,000 waiting a move across
    5,000 entries costs ~22 us the first way and ~5 us the second; across 50, 0.4 us
    against 5 (benchmarks/sglang.md)."""
    if (j - slot) * 16 < 2 * len(entries) - j - slot:
        entries[slot : j + 1] = [entries[j], *entries[slot:j]]
    else:
        entries.insert(slot, entries.pop(j))


class ListSnapshot:
    """The waiting list as Feather left it, and the requests admitted from its head since.

    The list Feather reordered in a pass is usually replaced by SGLang afterwards (the
    admitted filtered out into a new list), so that object itself, untouched since, is the
    list as the pass left it. Only when SGLang keeps the object (a pass that admitted
    nothing, then appends) is a copy needed: one is taken at each sync and Feather's moves
    are replayed on it then, not as they happen.
    """

    __slots__ = ("_admitted", "_copy", "_moves", "_ref", "fast", "full")

    def __init__(self) -> None:
        self._ref: list | None = None
        self._copy: list = []
        self._moves: list[tuple[int, int]] = []
        self._admitted: list = []
        self.fast = 0
        """Syncs that read only the appended tail (counted by the caller, which may still
        reject a tail and diff it all)."""
        self.full = 0
        """Syncs that diffed the whole list."""

    def take(self, queue: list) -> None:
        """Remember `queue` as it is now (the object, and a copy in case it is kept)."""
        self._ref, self._copy = queue, list(queue)
        self._moves, self._admitted = [], []

    def moved(self, j: int, slot: int) -> None:
        """Feather moved entry `j` of the list to `slot`."""
        self._moves.append((j, slot))

    def admitted(self, req: Any) -> None:
        """`req` was admitted from the list this pass."""
        self._admitted.append(req)

    def appended(self, queue: Sequence[Any]) -> list | None:
        """The entries appended to the remembered list after its admitted head left, or None
        when `queue` is not that (then nothing is known, and the caller diffs it all)."""
        snap, done = self._left_as(queue), self._admitted
        if snap is None:
            return None
        k = len(done)
        m = len(snap) - k
        if snap[:k] != done or len(queue) < m or queue[:m] != snap[k:]:
            return None
        return list(queue[m:])

    def _left_as(self, queue: Sequence[Any]) -> list | None:
        """The list as the last pass left it: the object itself when SGLang has replaced it,
        else the copy with Feather's moves replayed."""
        if self._ref is None:
            return None
        if queue is not self._ref:
            return self._ref
        for j, slot in self._moves:
            move(self._copy, j, slot)
        self._moves = []
        return self._copy
