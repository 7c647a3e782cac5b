"""Feather's tracker kept in step with SGLang's waiting list and running batch.

The CHT follows SGLang's lists by request id: set differences per sync, over only the
appended entries when the rest is as the last pass left it (`ListSnapshot`), through the same
`RequestTracker` the vLLM adapter uses (host/tracker.py). Only prompts seen for the first time
are hashed. Nothing from SGLang is imported: `rid`, `origin_input_ids` and the sampling
params' `max_new_tokens` are read off the requests given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from feather_sched.host.admission import PolicyHost
from feather_sched.host.tracker import RequestTracker
from feather_sched.sglang.fields import rid_of
from feather_sched.sglang.snapshot import ListSnapshot, RunningObjects, WaitingFigures


class ListSync:
    """Moves requests through the tracker as SGLang moves them between its lists."""

    def __init__(self, book: RequestTracker, host: PolicyHost, clock: Callable[[], float]) -> None:
        self.book = book
        self.index = book.cht
        self._host = host  # its counters: `hashed`, `admitted`
        self._clock = clock
        self.queue: Sequence[Any] = []
        """SGLang's waiting list as of the last sync."""
        self.passes = 0
        """Admission passes begun (counted by the queue; dates `chunked_rid`)."""
        self.num_preemptions = 0
        """Running requests SGLang put back in its waiting list, so far."""
        self.chunked_rid: str | None = None
        """The request SGLang is prefilling chunk by chunk: running, though in neither list."""
        self._chunk_pass = 0
        self.snapshot = ListSnapshot()
        """SGLang's waiting list as the last pass left it (`sync` reads only what changed)."""
        self.running_objects = RunningObjects()
        """SGLang's object of each request the CHT holds as running (`sync` diffs by it)."""
        self.figures = WaitingFigures()
        """Each waiting SGLang request's figures, keyed by the request object: read at C
        speed by the candidate search (`order`) and the grouping judge (`head_totals`)."""

    def sync(self, waiting_queue: Sequence[Any], running: Iterable[Any] | None) -> None:
        """Make the CHT hold SGLang's waiting list (WAITING) and running batch (RUNNING).

        A diff, so only requests that moved cost Python work. `running=None` (a caller
        without a running batch) leaves the running side alone.
        """
        book = self.book
        left, joined, listed = self._list_changes(waiting_queue)
        chunked = self._live_chunked(listed)
        cur = None if running is None else set(running)  # by identity, as SGLang's own sets
        if chunked is not None and cur is not None:
            cur.add(book.engine_request(chunked))
        now = self._clock()
        # left the waiting list: admitted (now running) or aborted
        for rid in left:
            req = book.engine_request(rid)
            if cur is None or req in cur:
                self._run(req, now)
            else:
                self._forget(rid)
        objs = self.running_objects
        moved = cur is not None and objs.differs(cur)
        if moved and cur is not None:  # left the batch, not back in the list: finished, aborted
            for rid in objs.left(cur):
                if rid not in joined:
                    self._forget(rid)
        if joined:
            self._rejoin(waiting_queue, joined, now)
        # Feather's running requests are now all in `cur` (those that left were forgotten or
        # wait again): any more in `cur` run unseen (e.g. Feather enabled mid-flight)
        if moved and cur is not None and len(cur) != len(objs):
            self._add_unseen_running(cur, chunked, now)
        self.snapshot.take(waiting_queue)
        self.queue = waiting_queue

    def _rejoin(self, waiting_queue: Sequence[Any], joined: set[str], now: float) -> None:
        """The requests that joined the list, in list order (found from its end, where SGLang
        appends them; the CHT's within-group order is list order, oldest first): retracted
        or preempted running ones wait again from now, under the object the list holds;
        the rest are new arrivals."""
        found: list[Any] = []
        for req in reversed(waiting_queue):
            if req.rid in joined:
                found.append(req)
                if len(found) == len(joined):
                    break
        run, fresh = self.book.running_ids, set()
        arrivals: list[Any] = []
        for req in reversed(found):
            if req.rid in run:
                self._wait(req, now)
                self.num_preemptions += 1
            else:
                arrivals.append(req)
                fresh.add(req.rid)
        if arrivals:
            self._add_new(iter(arrivals), fresh, now, running=False)

    def _add_unseen_running(self, cur: set, chunked: str | None, now: float) -> None:
        """The requests of the running batch `cur` (a set of SGLang's objects) that Feather
        does not hold as running and never saw waiting: a rid is read only off those."""
        book = self.book
        unknown = [
            req
            for req in self.running_objects.unseen(cur)
            if req.rid not in book.running_ids
            and req.rid not in book.waiting_ids
            and req.rid != chunked
        ]
        if unknown:
            self._add_new(iter(unknown), {req.rid for req in unknown}, now, running=True)

    def _list_changes(
        self, waiting_queue: Sequence[Any]
    ) -> tuple[set[str], set[str], Callable[[str], bool]]:
        """(rids that left the list, rids that joined it, is-a-rid-on-the-list) since the
        last sync: from the appended tail when the snapshot vouches for the rest, else from
        the whole list."""
        waiting, snapshot = self.book.waiting_ids, self.snapshot
        tail = snapshot.appended(waiting_queue)
        if tail is not None:
            joined = set(map(rid_of, tail))
            if not joined & waiting:
                snapshot.fast += 1
                return set(), joined, lambda rid: rid in waiting or rid in joined
        snapshot.full += 1
        cur_w = set(map(rid_of, waiting_queue))
        return waiting - cur_w, cur_w - waiting, cur_w.__contains__

    def _live_chunked(self, listed: Callable[[str], bool]) -> str | None:
        """The request still being prefilled chunk by chunk, if it still is: SGLang offers its
        chunked request to the adder every pass until its last chunk; one the last pass did
        not see was aborted or has finished chunking."""
        chunked = self.chunked_rid
        if chunked is None:
            return None
        stale = self._chunk_pass != self.passes - 1
        if stale or listed(chunked) or chunked not in self.index:
            self.chunked_rid = None
            return None
        return chunked

    def note_chunked(self, req: Any, still_chunked: bool) -> None:
        """The adder scheduled a chunk of `req` (`PrefillAdder.add_chunked_req`)."""
        rid = req.rid
        if rid not in self.index:
            self._add_new(iter((req,)), {rid}, self._clock(), running=True)
        elif rid in self.book.waiting_ids:
            self.admit(req)
        self.mark_chunked(rid if still_chunked else None)

    def mark_chunked(self, rid: str | None) -> None:
        """`rid` is prefilled chunk by chunk as of this pass (None: no request is)."""
        self.chunked_rid = rid
        self._chunk_pass = self.passes

    def _add_new(self, reqs: Iterator[Any], rids: set[str], now: float, running: bool) -> None:
        need = len(rids)
        book = self.book
        for req in reqs:
            rid = req.rid
            if rid not in rids or rid in self.index:
                continue
            if running:
                self._run(req, now)
            else:
                self._wait(req, now)
            need -= 1
            if not need:
                break
        self._host.stats.hashed = book.hashed

    def _wait(self, req: Any, now: float) -> None:
        rid = req.rid
        self.running_objects.unmark(rid)
        self.book.waiting(req, now)
        self.figures.enter(req, rid, self.figures_of(rid))

    def figures_of(self, rid: str) -> tuple[int, int, int]:
        """What `figures` records for a waiting request: (list order, output, chain levels)."""
        return self.book.order(rid), self.book.request(rid).output_len, self.index.total_chunks(rid)

    def _forget(self, rid: str) -> None:
        self.running_objects.unmark(rid)
        self.figures.leave(rid)
        self.book.forget(rid)

    def _run(self, req: Any, now: float) -> None:
        """`req` runs (admitted, or running unseen): the book, and the running object."""
        self.running_objects.unmark(req.rid)
        self.book.running(req, now)
        self.running_objects.mark(req)

    def admit(self, req: Any) -> None:
        """SGLang admitted `req`, which Feather holds waiting (`running` without its checks:
        the hot path, once an admission)."""
        self.index.admit(req.rid)
        self.running_objects.mark(req)
        self.snapshot.admitted(req)
        self._host.stats.admitted += 1

    def check(self, waiting_queue: Sequence[Any], running: Iterable[Any]) -> None:
        """Raise if the CHT disagrees with SGLang's lists (tests and debugging)."""
        cur_w = set(map(rid_of, waiting_queue))
        cur_r = set(map(rid_of, running))
        if self.chunked_rid is not None:
            cur_r.add(self.chunked_rid)
        waiting, running_ids = self.book.waiting_ids, self.book.running_ids
        if cur_w != waiting or cur_r != running_ids:
            raise AssertionError(
                f"CHT out of step: waiting {sorted(waiting ^ cur_w)[:5]}, "
                f"running {sorted(running_ids ^ cur_r)[:5]}"
            )
        if self.index.num_waiting != len(cur_w) or self.index.num_running != len(cur_r):
            raise AssertionError("CHT counts disagree with SGLang's lists")
        if not self.running_objects.agrees(running_ids):
            raise AssertionError("the running objects disagree with the CHT")
        for req in waiting_queue:
            if self.figures.of(req) != self.figures_of(req.rid):
                raise AssertionError(f"the waiting figures of {req.rid!r} disagree with the CHT")
