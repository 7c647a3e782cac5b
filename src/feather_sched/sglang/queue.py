"""Feather's side of SGLang's waiting queue: a CHT kept in step with it, and one admission pass.

SGLang 0.5.x forms a prefill batch in `Scheduler._get_new_batch_prefill_raw`
(python/sglang/srt/managers/scheduler.py): `self.policy.calc_priority(self.waiting_queue,
running_batch)` orders the list in place, then `for req in self.waiting_queue:` offers each
request to a `PrefillAdder` (`add_one_req`) and breaks at the first result that is not
CONTINUE. The adder owns every memory decision (token budget, KV pool, request slots).

A Feather policy is lazy: it proposes the next candidate after the previous one was admitted
(`Policy.candidates`, as the simulator's `_admit` drives it). So a pass here is lazy too:
`begin_pass` (from `calc_priority`) puts the policy's first candidate at the head of the list;
each time the adder admits the candidate the scheduler offered, the next candidate is moved into
the slot the scheduler's `for` loop reads next (a list iterator reads by index, so moving items
ahead of it is seen; Python reference, "The for statement"). No order is computed for requests
SGLang will not reach this pass, and ADD/STOP is asked exactly when SGLang offers a request.

The CHT follows SGLang's lists by request id (set differences per pass, over only the
appended entries when the rest is as the last pass left it: `ListSnapshot`), through the same
`RequestTracker` the vLLM adapter uses (host/tracker.py); only prompts seen for the first
time are hashed (`chunk_digests` over `origin_input_ids`). This module imports nothing
from SGLang: it reads `rid`, `origin_input_ids`, `sampling_params.max_new_tokens`, `extra_key`
and `cache_salt` off the requests it is given.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from feather_sched.host.admission import AdmissionPass, Hosted, PolicyHost
from feather_sched.host.tracker import RequestTracker, chunk_blocks
from feather_sched.policies.base import Policy
from feather_sched.request import Request
from feather_sched.settings import PolicyStateSaver
from feather_sched.sglang.fields import SGLANG_FIELDS, kv_need, rid_of
from feather_sched.sglang.snapshot import (
    ListSnapshot,
    RunningObjects,
    WaitingFigures,
    move,
)


class Offer(Enum):
    """What `SGLangQueue.before_offer` tells the adder to do with the request SGLang offers."""

    TRY = "try"
    """Let SGLang's adder try it (the adder still decides whether it fits)."""
    STOP = "stop"
    """End the pass (the policy's STOP)."""
    SKIP = "skip"
    """Leave it waiting this pass and go on with the next (its prefix is in flight)."""


UNBOUNDED_SEQS = 1 << 30
"""`max_num_seqs` until the scheduler tells us its `max_running_requests`."""


@dataclass
class _Pass:
    """One admission pass over SGLang's list: the shared dialogue with the policy (`step`),
    the candidate SGLang should offer next (`pending`, at list position `pos`)."""

    queue: list
    step: AdmissionPass
    pending: str | None = None
    pos: int = 0
    stopped: bool = False  # the policy said STOP (or has no candidate left)
    deferring: bool = False
    """A candidate's prefix was in flight: the rest of the pass walks SGLang's list order,
    each request asked ADD/STOP, those whose prefix is in flight skipped."""
    deferred: set = field(default_factory=set)
    """The in-flight prefixes (CHT keys) whose waiting members this pass skips."""
    reserved: int = 0
    """KV tokens those members will take next pass (kept free: `_offer_in_list_order`)."""


class SGLangQueue(Hosted):
    """The CHT, the policy and one admission pass, tied to one SGLang `SchedulePolicy`.

    Also the policy's `SchedulerView`: the view is live, so after the adder admits a
    candidate the index, `num_running` and `waiting_ids()` already reflect it.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        chunk_tokens: int = 64,
        block_size: int = 1,
        tree_cache: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = PolicyHost(policy, engine="SGLang")
        block_size = max(1, int(block_size))
        self.book = RequestTracker(
            block_size, chunk_blocks(chunk_tokens, block_size), SGLANG_FIELDS
        )
        """The CHT and each request's metadata, kept as the vLLM adapter keeps them."""
        self.index = self.book.cht
        self.tree_cache = tree_cache
        self.block_size = block_size  # SchedulerView: SGLang's KV page, in tokens
        self._clock = clock
        self.max_num_seqs = UNBOUNDED_SEQS
        self.max_num_batched_tokens: int | None = None
        """SchedulerView: the prompt tokens one prefill batch may compute (SGLang's
        `max_prefill_tokens`, or its chunked-prefill size where smaller), set with
        `max_num_seqs` once the scheduler builds an adder. None until then: the policy's
        `GroupingJudge` then assumes grouped order can pay."""
        self.overlaps_cpu: bool | None = None
        """SchedulerView: whether SGLang runs its overlap loop (`scheduler.enable_overlap`),
        set with the limits above; None until then (the judge then assumes it does)."""
        self.num_preemptions = 0
        """SchedulerView: running requests SGLang put back in its waiting list (retracted
        under KV pressure), so far. The judge counts KV as binding for a while after one."""
        self.passes = 0
        self._radix_on = False
        """SGLang's radix cache is on (`_prefix_in_flight`), read at each pass's start."""
        self.timer: Callable[[], float] | None = None
        """Clock of `stats.ordering_s`, kept only when set (a benchmark sets
        `time.process_time`). None, the default: not timed, as a server runs (timing costs an
        admission four clock reads and two counter updates)."""
        self.chunked_rid: str | None = None
        """The request SGLang is prefilling chunk by chunk: running, though in neither list."""
        self._chunk_pass = 0
        self._queue: Sequence[Any] = []
        self._pass: _Pass | None = None
        self._last_step: tuple[float, int, int] | None = None
        self.state_saver: PolicyStateSaver | None = None
        """Saves the policy's learned state while serving (`FEATHER_POLICY_STATE`)."""
        self.snapshot = ListSnapshot()
        """SGLang's waiting list as the last pass left it (`sync` reads only what changed)."""
        self.adder_classes: dict[type, type] = {}
        """Feather adder subclasses built for this queue, by SGLang base class."""
        self.running_objects = RunningObjects()
        """SGLang's object of each request the CHT holds as running (`sync` diffs by it)."""
        self.figures = WaitingFigures()
        """Each waiting SGLang request's figures, keyed by the request object: its
        `RequestTracker.order`, which `_position`'s binary search reads through
        `dict.__getitem__`, a C call per probe (a Python key function cost ~0.8 us a probe
        between SGLang's own work); its output tokens and chain levels (`head_totals`)."""

    # ------------------------------------------------------------------ SchedulerView
    @property
    def now(self) -> float:
        return self._clock()

    @property
    def num_running(self) -> int:
        return self.index.num_running

    @property
    def num_waiting(self) -> int:
        return self.index.num_waiting

    def waiting_ids(self) -> Iterator[str]:
        waiting = self.book.waiting_ids
        return (rid for rid in map(rid_of, self._queue) if rid in waiting)

    def request(self, request_id: str) -> Request:
        return self.book.request(request_id)

    def head_totals(self, n: int) -> tuple[int, int, int] | None:
        """(requests, output tokens, CHT chain levels) of the first `n` waiting, for the
        grouping judge's wave (`policies/order.py`), summed at C speed over `figures`. Read
        right after a sync (the pass's start, where the judge asks), when the list holds
        exactly the waiting; None when its length says otherwise (admitted requests stay
        listed until the pass ends), and the judge then reads them one by one."""
        queue = self._queue
        if len(queue) != self.index.num_waiting:
            return None
        return self.figures.totals(queue[:n])

    def arrival_time(self, request_id: str) -> float:
        """When Feather first saw the request waiting (reset when it is retracted)."""
        return self.book.entered(request_id)

    def block_hashes(self, request_id: str) -> Sequence[int]:
        return self.book.block_digests(request_id)

    def cached_blocks(self, request_id: str) -> int:
        """Leading prompt blocks SGLang's radix cache holds (a real tree match, as lpm does)."""
        if self.tree_cache is None:
            return 0
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        sg = self.book.engine_request(request_id)
        key = RadixKey(
            token_ids=sg.origin_input_ids,
            extra_key=getattr(sg, "extra_key", None),
            cache_salt=getattr(sg, "cache_salt", None),
        )
        hit = self.tree_cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len
        return int(hit) // self.block_size

    # ------------------------------------------------------------------ keeping in step
    def sync(self, waiting_queue: Sequence[Any], running: Iterable[Any] | None) -> None:
        """Make the CHT hold SGLang's waiting list (WAITING) and running batch (RUNNING).

        A diff, so only requests that moved cost Python work: the waiting list by rid, read
        only in its appended tail when the list is the last pass's without its admitted head
        (`ListSnapshot`); the running batch as a set of objects, looked into only when it
        differs from the requests Feather holds as running (`RunningObjects`).
        `running=None` (a caller without a running batch) leaves the running side alone.
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
        self._queue = waiting_queue

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
            self._admit(req)
        self.chunked_rid = rid if still_chunked else None
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
        self.stats.hashed = book.hashed

    def _wait(self, req: Any, now: float) -> None:
        rid = req.rid
        self.running_objects.unmark(rid)
        self.book.waiting(req, now)
        self.figures.enter(req, rid, self._figures_of(rid))

    def _figures_of(self, rid: str) -> tuple[int, int, int]:
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

    def _admit(self, req: Any) -> None:
        """SGLang admitted `req`, which Feather holds waiting (`running` without its checks:
        the hot path, once an admission)."""
        self.index.admit(req.rid)
        self.running_objects.mark(req)
        self.snapshot.admitted(req)
        self.host.stats.admitted += 1

    # ------------------------------------------------------------------ one admission pass
    def begin_pass(self, waiting_queue: list, running: Iterable[Any] | None) -> None:
        """`calc_priority`: sync, then put the policy's first candidate at the list head."""
        timer = self.timer
        t0 = timer() if timer else 0.0
        self._end_pass()
        self.passes += 1
        # no radix cache: SGLang's own test, `disable` absent counting as off (read once)
        self._radix_on = not getattr(self.tree_cache, "disable", True)
        self.sync(waiting_queue, running)
        p = self._pass = _Pass(
            waiting_queue, self.host.begin(self, self.book.waiting_ids.__contains__)
        )
        if not p.step.engine_order:
            self._advance(p, 0)
        if timer:
            self.stats.ordering_s += timer() - t0

    def before_offer(
        self, req: Any, nothing_admitted: bool, room: Callable[[], float] | None = None
    ) -> Offer:
        """The scheduler offers `req` to the adder: try it, STOP the pass, or skip it. `room`:
        reads the KV tokens the adder has left after the running requests' growth (SGLang's
        `rem_total_tokens`, read only after a deferral; None where unknown)."""
        p = self._pass
        if p is None or p.step.engine_order:
            return Offer.TRY
        timer = self.timer
        t0 = timer() if timer else 0.0
        try:
            if p.stopped:
                return self._never_stall(p, req, nothing_admitted)
            if p.deferring:
                return self._offer_in_list_order(p, req, nothing_admitted, room)
            if req.rid != p.pending:
                # The scheduler skipped our candidate (LoRA limit, pooling mode, storage
                # prefetch: `continue` before add_one_req) or walks another list: let SGLang
                # finish this pass in its own order rather than stall.
                self.stats.handovers += 1
                p.step.hand_over()
                return Offer.TRY
            if self._prefix_in_flight(req):
                p.deferring, p.pending = True, None
                return self._skip(p, req, nothing_admitted)
            return self._decide(p, req, nothing_admitted)
        finally:
            if timer:
                self.stats.ordering_s += timer() - t0

    def _offer_in_list_order(
        self, p: _Pass, req: Any, nothing_admitted: bool, room: Callable[[], float] | None
    ) -> Offer:
        """After a deferral: the policy's order would offer the in-flight group's members one
        after another (its order follows the running batch, which now holds the group), so
        the rest of the pass takes SGLang's list as it stands (arrival order past Feather's
        picks) and fills the step's budget with requests that compute nothing twice; each
        is still the policy's ADD or STOP. A request whose prefix is in flight waits a pass
        and finds it cached. The pass stops where admitting `req` would leave less KV than
        the skipped groups take next pass: under KV pressure their room goes to them, as
        ending the pass would give it, rather than to new prefixes mixed in. Mamba state
        that SGLang matched for a skipped request would be freed only on a break
        (`Scheduler._get_new_batch_prefill_raw`), so such a request ends the pass."""
        if self._prefix_in_flight(req):
            return self._skip(p, req, nothing_admitted)
        cached = int(getattr(req, "prefix_len", 0) or 0)
        if room is None or room() - kv_need(req, cached) >= p.reserved:
            return self._decide(p, req, nothing_admitted)
        p.stopped = True
        return self._never_stall(p, req, nothing_admitted)

    def _skip(self, p: _Pass, req: Any, nothing_admitted: bool) -> Offer:
        """Defer `req`, whose prefix is in flight: skipped, its group's KV kept for next pass."""
        self.stats.deferrals += 1
        self._reserve_group(p, req)
        if not getattr(getattr(req, "kv", None), "holds_mamba", False):
            return Offer.SKIP
        p.stopped = True
        return self._never_stall(p, req, nothing_admitted)

    def _reserve_group(self, p: _Pass, req: Any) -> None:
        """Count once the KV the waiting members of `req`'s in-flight prefix need next pass:
        each its part past the prefix and its output, up to the free request slots."""
        index = self.index
        matched = index.matched_chunks(req.rid)
        key = index.keys_of(req.rid)[matched - 1]
        if key in p.deferred:
            return
        p.deferred.add(key)
        slots = max(1, self.max_num_seqs - index.num_running)
        members = min(index.group_size(req.rid, matched), slots)
        p.reserved += members * kv_need(req, matched * index.chunk_size)

    def _decide(self, p: _Pass, req: Any, nothing_admitted: bool) -> Offer:
        if p.step.accept(req.rid):
            return Offer.TRY
        p.stopped = True
        return self._never_stall(p, req, nothing_admitted)

    def _prefix_in_flight(self, req: Any) -> bool:
        """Whether `req` shares at least a chunk with a running request that SGLang's radix
        cache does not hold yet: a request admitted earlier in this pass, whose prefill has
        not run (or one still prefilling chunk by chunk). SGLang inserts a prefix into its
        radix tree once it is computed, so one prefill batch computes a shared prefix once
        per member; vLLM caches a block when it allocates it (`KVCacheManager.allocate_slots`
        caches up to the tokens the step computes), so its batch shares it. The pass skips
        such a request (`_offer_in_list_order`): it joins the next pass (a step later) and
        finds the prefix cached. SGLang's own cache-aware policies defer such requests for
        the same reason (`SchedulePolicy`'s in-batch prefix caching, which moves them to
        the end of its order). Read off `req.prefix_len`, the radix match SGLang made just
        before offering it (`Req.init_next_round_input`), which never covers a prompt's last
        token. Measured: benchmarks/sglang/loop.md."""
        cached = getattr(req, "prefix_len", None)
        if cached is None or not self._radix_on:
            return False
        index, page = self.index, self.block_size
        matchable = (len(req.origin_input_ids) - 1) // page * page
        shared = min(index.matched_chunks(req.rid) * index.chunk_size, matchable)
        return shared - int(cached) >= index.chunk_size

    def after_offer(self, req: Any, added: bool, proceed: bool, chunked: bool) -> None:
        """The adder answered: `added` to its batch; `proceed` = CONTINUE (look further)."""
        timer = self.timer
        t0 = timer() if timer else 0.0
        rid = req.rid
        if added and rid in self.book.waiting_ids:
            self._admit(req)
        if added and chunked:
            self.chunked_rid = rid
            self._chunk_pass = self.passes
        p = self._pass
        if p is not None and not p.step.engine_order and not p.stopped and rid == p.pending:
            if added and proceed:
                self._advance(p, p.pos + 1)
            else:
                p.pending = None
                p.stopped = True
        if timer:
            self.stats.ordering_s += timer() - t0

    def _never_stall(self, p: _Pass, req: Any, nothing_admitted: bool) -> Offer:
        # As the simulator: a STOP while nothing runs would leave the engine idle forever.
        # SGLang offers its list head after a STOP; the pass decides whether it is admitted.
        if not nothing_admitted:
            return Offer.STOP
        forced = p.step.force_head(self.index.num_running, lambda: req) is not None
        return Offer.TRY if forced else Offer.STOP

    def _advance(self, p: _Pass, slot: int) -> None:
        """Ask the policy for its next candidate and move it into list position `slot`."""
        rid = p.step.next_candidate()
        if rid is None:
            p.pending = None
            p.stopped = not p.step.engine_order
            return
        queue, req = p.queue, self.book.engine_request(rid)
        if slot >= len(queue) or queue[slot] is not req:
            try:
                j = self._position(queue, req, slot)
            except ValueError:  # not in the list the scheduler walks: SGLang's order then
                self.stats.handovers += 1
                p.step.hand_over()
                return
            if j != slot:
                move(queue, j, slot)
                self.snapshot.moved(j, slot)
        p.pending = rid
        p.pos = slot

    def _position(self, queue: list, req: Any, slot: int) -> int:
        """Where `req` stands in the list, at `slot` or after (ValueError: absent).

        SGLang appends arrivals and retracted requests, so beyond the candidates Feather moved
        to the head its list is sorted by `RequestTracker.order`: a binary search finds the
        request in ~14 probes at 10,000 waiting, where `list.index` compares entry after
        entry. A list not sorted there (SGLang's own re-sort) fails the identity check and
        falls back to the scan."""
        order = self.figures.order
        try:
            i = bisect_left(queue, order[req], lo=slot, key=order.__getitem__)
        except KeyError:  # an entry Feather never saw waiting: not sorted there
            i = -1
        if 0 <= i < len(queue) and queue[i] is req:
            return i
        return queue.index(req, slot)

    def _end_pass(self) -> None:
        p, self._pass = self._pass, None
        if p is not None:
            p.step.close()

    # ------------------------------------------------------------------ step feedback
    def end_previous_step(self) -> None:
        """The event loop is back for a new batch: the previous one ran until now.

        Called before this iteration admits anything, so that the decisions it makes are
        credited with the step they shape (the bandit's own-step term), not the one before.
        A step's time is the wall time from one iteration's batch pick to the next
        iteration's start (one forward); idle iterations (no batch) report nothing.
        """
        last, self._last_step = self._last_step, None
        if last is None or last[1] <= 0:
            return
        self.host.feedback(self, self._clock() - last[0], last[1], last[2])

    def on_idle(self, waiting_queue: Sequence[Any], running: Iterable[Any] | None) -> None:
        """An event-loop iteration with no batch: sync, so requests that finished (or were
        aborted) since the last admission pass leave the CHT now. Without it they stay until
        the next pass, which only comes with the next arrival. Nothing to do when empty."""
        if self.index.is_empty():
            return
        self._end_pass()
        self.sync(waiting_queue, running)

    def on_step(self, batch_size: int, prefill_tokens: int) -> None:
        """This iteration picked its batch; it runs from now until `end_previous_step`."""
        self._last_step = (self._clock(), batch_size, prefill_tokens)

    # ------------------------------------------------------------------ checks
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
            if self.figures.of(req) != self._figures_of(req.rid):
                raise AssertionError(f"the waiting figures of {req.rid!r} disagree with the CHT")
