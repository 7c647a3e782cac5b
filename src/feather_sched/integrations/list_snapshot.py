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
    """Move entry `j` to position `slot` (<= j), shifting the ones between by one. A slice
    assignment of equal length copies only those j - slot + 1 references, where pop(j) then
    insert(slot) shift the whole tail twice (the list can hold 10,000 waiting requests)."""
    entries[slot : j + 1] = [entries[j], *entries[slot:j]]


class ListSnapshot:
    """The waiting list as Feather left it, and the requests admitted from its head since."""

    __slots__ = ("_admitted", "_snap", "fast", "full")

    def __init__(self) -> None:
        self._snap: list | None = None
        self._admitted: list = []
        self.fast = 0
        """Syncs that read only the appended tail."""
        self.full = 0
        """Syncs that had to diff the whole list."""

    def take(self, queue: Sequence[Any]) -> None:
        """Remember `queue` as it is now (a copy: SGLang may append to the same object)."""
        self._snap = list(queue)
        self._admitted = []

    def moved(self, j: int, slot: int) -> None:
        """Feather moved entry `j` of the list to `slot` (the same move on the copy)."""
        if self._snap is not None:
            move(self._snap, j, slot)

    def admitted(self, req: Any) -> None:
        """`req` was admitted from the list this pass."""
        self._admitted.append(req)

    def appended(self, queue: Sequence[Any]) -> list | None:
        """The entries appended to the remembered list after its admitted head left, or None
        when `queue` is not that (then nothing is known, and the caller diffs it all)."""
        snap, done = self._snap, self._admitted
        if snap is None:
            self.full += 1
            return None
        k = len(done)
        m = len(snap) - k
        if snap[:k] != done or len(queue) < m or queue[:m] != snap[k:]:
            self.full += 1
            return None
        self.fast += 1
        return list(queue[m:])
