"""What SGLang did to its lists since Feather last looked, without reading every entry.

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

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["ListSnapshot", "RunningObjects", "WaitingFigures", "move"]


def move(entries: list, j: int, slot: int) -> None:
    """Move entry `j` to position `slot` (<= j), shifting the ones between by one.

    Two ways, the cheaper for the distance: a slice assignment of equal length touches only
    the j - slot + 1 references between, but each with its reference count (~4 ns an entry
    on the dev VM); pop(j) then insert(slot) shift the tails behind j and slot with a plain
    memmove (~0.25 ns an entry) whatever the distance. At 10,000 waiting a move across
    5,000 entries costs ~22 us the first way and ~5 us the second; across 50, 0.4 us
    against 5 (benchmarks/sglang/pass.md)."""
    if (j - slot) * 16 < 2 * len(entries) - j - slot:
        entries[slot : j + 1] = [entries[j], *entries[slot:j]]
    else:
        entries.insert(slot, entries.pop(j))


class ListSnapshot:
    """The waiting list as Feather left it, and the requests admitted from it since.

    A copy of the list is kept from each sync, and Feather's moves are replayed on it at the
    next (a memmove each, no reference counting). Checking the next list then costs C-speed
    work on the entries that changed, not on the whole list: the copy is edited into what
    SGLang's list should now be (the admitted taken out, the tail appended), compared by
    identity (a pointer compare an entry), and kept as the next copy. Slicing or copying the
    whole list would touch every request's reference count: at 10,000 waiting that was ~0.26
    ms a pass on the dev VM (benchmarks/sglang/pass.md). SGLang's own lists are only read.
    """

    __slots__ = ("_admitted", "_copy", "_equal", "_moves", "fast", "full")

    def __init__(self) -> None:
        self._copy: list | None = None
        """Our own list, equal to SGLang's when it was taken (None: nothing known)."""
        self._equal = False
        """`_copy` was just found equal to SGLang's list (by `appended`)."""
        self._moves: list[tuple[int, int]] = []
        self._admitted: list = []
        self.fast = 0
        """Syncs that read only the appended tail (counted by the caller, which may still
        reject a tail and diff it all)."""
        self.full = 0
        """Syncs that diffed the whole list."""

    def take(self, queue: list) -> None:
        """Remember `queue` as it is now (our copy: the one `appended` has just made equal to
        it, else one made now)."""
        if not self._equal or self._copy is None:
            self._copy = list(queue)
        self._moves, self._admitted, self._equal = [], [], False

    def moved(self, j: int, slot: int) -> None:
        """Feather moved entry `j` of the list to `slot`."""
        self._moves.append((j, slot))

    def admitted(self, req: Any) -> None:
        """`req` was admitted from the list this pass."""
        self._admitted.append(req)

    def appended(self, queue: Sequence[Any]) -> list | None:
        """The entries appended to the remembered list after its admitted entries left, or
        None when `queue` is not that (then nothing is known, and the caller diffs it all).
        SGLang keeps the rest in order (`[x for x in waiting_queue if x not in can_run_set]`),
        and the admitted are in the list's order, the last of them as far as its pass went."""
        snap, done = self._left_as(), self._admitted
        self._copy, self._equal = None, False
        if snap is None or (done and not _drop_admitted(snap, done)):
            return None
        m = len(snap)
        if len(queue) < m:
            return None
        tail = list(queue[m:])
        snap.extend(tail)
        if snap != queue:  # identity first: a pointer compare an entry
            return None
        self._copy, self._equal = snap, True
        return tail

    def _left_as(self) -> list | None:
        """Our copy with Feather's moves replayed: the list as the last pass left it (SGLang
        has since replaced that list, or kept it and appended to it)."""
        copy = self._copy
        if copy is None:
            return None
        for j, slot in self._moves:
            move(copy, j, slot)
        self._moves = []
        return copy


def _drop_admitted(entries: list, admitted: list) -> bool:
    """Take `admitted` (in list order) out of `entries`, in place; False if one is absent.
    Only the head up to the last admitted entry is read."""
    try:
        end = entries.index(admitted[-1]) + 1
    except ValueError:
        return False
    if end == len(admitted):
        head_ok = entries[:end] == admitted
        del entries[:end]
        return head_ok
    gone = set(map(id, admitted))
    kept = [x for x in entries[:end] if id(x) not in gone]
    entries[:end] = kept
    return len(kept) == end - len(admitted)


class RunningObjects:
    """The engine's object of each request Feather holds as running, by object and by rid.

    SGLang's running batch is compared with it as a set of objects (hashed by identity, as
    SGLang's own sets of requests are), so a pass whose batch is the one Feather left costs
    one C-speed superset test, and a rid is read only off the objects that changed. Reading
    every running request's rid cost ~0.05 ms a pass at 224 running in SGLang's formation, on
    the caches its own work had just swept (benchmarks/sglang/pass.md, "The feather policy's pass
    trimmed"). Each recorded object is referenced here, so its identity stays its own.
    """

    __slots__ = ("_key", "_objs")

    def __init__(self) -> None:
        self._objs: dict[Any, str] = {}
        self._key: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self._objs)

    def mark(self, req: Any) -> None:
        """`req` is the object of a running rid."""
        rid = req.rid
        self._objs[req] = rid
        self._key[rid] = req

    def unmark(self, rid: str) -> None:
        """`rid` no longer runs (no-op if it did not)."""
        req = self._key.pop(rid, None)
        if req is not None:
            del self._objs[req]

    def differs(self, batch: set) -> bool:
        """Whether the batch (a set of objects) is not exactly the recorded objects."""
        objs = self._objs
        return len(batch) != len(objs) or not batch.issuperset(objs)

    def left(self, batch: set) -> list[str]:
        """The rids of recorded objects the batch no longer holds."""
        objs = self._objs
        return [objs[req] for req in objs.keys() - batch]

    def unseen(self, batch: set) -> set:
        """The batch's objects not recorded."""
        return batch.difference(self._objs)

    def agrees(self, running_ids: Iterable[str]) -> bool:
        """Whether exactly `running_ids` are recorded, each under its own object."""
        key, objs = self._key, self._objs
        return (
            len(objs) == len(key)
            and key.keys() == set(running_ids)
            and all(objs.get(req) == rid == req.rid for rid, req in key.items())
        )


class WaitingFigures:
    """Figures of each request Feather holds waiting, keyed by the engine's object (hashed by
    identity, as in `RunningObjects`), one dict a figure: a pass reads them for a run of
    SGLang's list at C speed (`map` over a dict's `__getitem__`), where a Python call a
    request costs ~1-2 us on the caches SGLang's own work sweeps. `order` is what the
    binary search for a candidate's list position reads (`RequestTracker.order`); `output`
    and `levels` (output tokens, CHT chain levels) are what the grouping judge's wave sums.
    One object a rid: a request that waits again under a new object (SGLang may copy it)
    drops the old one's figures."""

    __slots__ = ("_obj", "levels", "order", "output")

    def __init__(self) -> None:
        self.order: dict[Any, int] = {}
        self.output: dict[Any, int] = {}
        self.levels: dict[Any, int] = {}
        self._obj: dict[str, Any] = {}

    def enter(self, req: Any, rid: str, figures: tuple[int, int, int]) -> None:
        """`req` (request `rid`) waits (again): its (order, output, levels)."""
        old = self._obj.get(rid)
        if old is not None and old is not req:
            self.leave(rid)
        self._obj[rid] = req
        self.order[req], self.output[req], self.levels[req] = figures

    def leave(self, rid: str) -> None:
        """`rid` is gone (no-op for one never recorded)."""
        req = self._obj.pop(rid, None)
        if req is not None:
            del self.order[req], self.output[req], self.levels[req]

    def of(self, req: Any) -> tuple[int | None, int | None, int | None]:
        """(order, output, levels) recorded for `req` (None where it has none)."""
        return self.order.get(req), self.output.get(req), self.levels.get(req)

    def totals(self, entries: Sequence[Any]) -> tuple[int, int, int] | None:
        """(entries, their output tokens, their chain levels); None if one is not recorded."""
        try:
            output = sum(map(self.output.__getitem__, entries))
            return len(entries), output, sum(map(self.levels.__getitem__, entries))
        except KeyError:
            return None
