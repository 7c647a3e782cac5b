"""Feather's side of SGLang's waiting queue: one lazy admission pass over it.

SGLang 0.5.x forms a prefill batch in `Scheduler._get_new_batch_prefill_raw`:
`self.policy.calc_priority(self.waiting_queue, running_batch)` orders the list in place, then
`for req in self.waiting_queue:` offers each request to a `PrefillAdder` (`add_one_req`),
which owns every memory decision, and breaks at the first result that is not CONTINUE.
A Feather policy proposes its next candidate after the previous one was admitted, so
`begin_pass` puts the first candidate at the list head and each admission moves the next into
the slot the `for` loop reads next (a list iterator reads by index, so it sees the move).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from feather_sched.host.admission import AdmissionPass
from feather_sched.policies.base import Policy
from feather_sched.settings import PolicyStateSaver
from feather_sched.sglang.deferral import InFlightPrefixes
from feather_sched.sglang.snapshot import move
from feather_sched.sglang.view import SGLangView

__all__ = ["Offer", "SGLangQueue"]


class Offer(Enum):
    """What `SGLangQueue.before_offer` tells the adder to do with the request SGLang offers."""

    TRY = "try"
    """Let SGLang's adder try it (the adder still decides whether it fits)."""
    STOP = "stop"
    """End the pass (the policy's STOP)."""
    SKIP = "skip"
    """Leave it waiting this pass and go on with the next (its prefix is in flight)."""


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


class SGLangQueue(SGLangView):
    """The admission dialogue with SGLang's adder, over the view the policy reads."""

    def __init__(self, policy: Policy, **view_options: Any) -> None:
        """`view_options`: `SGLangView`'s (chunk_tokens, block_size, tree_cache, clock)."""
        super().__init__(policy, **view_options)
        self.deferral = InFlightPrefixes(self.index, self.block_size)
        self.timer: Callable[[], float] | None = None
        """Clock of `stats.ordering_s`, kept only when set (a benchmark sets
        `time.process_time`); None, as a server runs: not timed."""
        self._pass: _Pass | None = None
        self._last_step: tuple[float, int, int] | None = None
        self.state_saver: PolicyStateSaver | None = None
        """Saves the policy's learned state while serving (`FEATHER_POLICY_STATE`)."""
        self.adder_classes: dict[type, type] = {}
        """Feather adder subclasses built for this queue, by SGLang base class."""

    # ------------------------------------------------------------------ keeping in step
    def sync(self, waiting_queue: Sequence[Any], running: Iterable[Any] | None) -> None:
        """Make the CHT hold SGLang's waiting list and running batch (`ListSync.sync`)."""
        self.lists.sync(waiting_queue, running)

    def note_chunked(self, req: Any, still_chunked: bool) -> None:
        """The adder scheduled a chunk of `req` (`PrefillAdder.add_chunked_req`)."""
        self.lists.note_chunked(req, still_chunked)

    def check(self, waiting_queue: Sequence[Any], running: Iterable[Any]) -> None:
        """Raise if the CHT disagrees with SGLang's lists (tests and debugging)."""
        self.lists.check(waiting_queue, running)

    # ------------------------------------------------------------------ one admission pass
    def begin_pass(self, waiting_queue: list, running: Iterable[Any] | None) -> None:
        """`calc_priority`: sync, then put the policy's first candidate at the list head."""
        timer = self.timer
        t0 = timer() if timer else 0.0
        self._end_pass()
        self.lists.passes += 1
        self.deferral.begin(self.tree_cache)
        self.lists.sync(waiting_queue, running)
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
            if self.deferral.in_flight(req):
                p.deferring, p.pending = True, None
                return self._skip(p, req, nothing_admitted)
            return self._decide(p, req, nothing_admitted)
        finally:
            if timer:
                self.stats.ordering_s += timer() - t0

    def _offer_in_list_order(
        self, p: _Pass, req: Any, nothing_admitted: bool, room: Callable[[], float] | None
    ) -> Offer:
        """After a deferral the policy's order would offer the in-flight group's members one
        after another, so the rest of the pass takes SGLang's list as it stands, each request
        still the policy's ADD or STOP. The pass stops where admitting `req` would eat into
        the KV the skipped groups take next pass (`InFlightPrefixes.leaves_reserve`)."""
        if self.deferral.in_flight(req):
            return self._skip(p, req, nothing_admitted)
        if self.deferral.leaves_reserve(req, room):
            return self._decide(p, req, nothing_admitted)
        p.stopped = True
        return self._never_stall(p, req, nothing_admitted)

    def _skip(self, p: _Pass, req: Any, nothing_admitted: bool) -> Offer:
        """Defer `req`, whose prefix is in flight: skipped, its group's KV kept for next pass.
        Mamba state SGLang matched for a skipped request is freed only on a break
        (`Scheduler._get_new_batch_prefill_raw`), so such a request ends the pass."""
        self.stats.deferrals += 1
        self.deferral.reserve(req, self.max_num_seqs)
        if not getattr(getattr(req, "kv", None), "holds_mamba", False):
            return Offer.SKIP
        p.stopped = True
        return self._never_stall(p, req, nothing_admitted)

    def _decide(self, p: _Pass, req: Any, nothing_admitted: bool) -> Offer:
        if p.step.accept(req.rid):
            return Offer.TRY
        p.stopped = True
        return self._never_stall(p, req, nothing_admitted)

    def after_offer(self, req: Any, added: bool, proceed: bool, chunked: bool) -> None:
        """The adder answered: `added` to its batch; `proceed` = CONTINUE (look further)."""
        timer = self.timer
        t0 = timer() if timer else 0.0
        rid = req.rid
        if added and rid in self.book.waiting_ids:
            self.lists.admit(req)
        if added and chunked:
            self.lists.mark_chunked(rid)
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
                self.lists.snapshot.moved(j, slot)
        p.pending = rid
        p.pos = slot

    def _position(self, queue: list, req: Any, slot: int) -> int:
        """Where `req` stands in the list, at `slot` or after (ValueError: absent).

        SGLang appends arrivals and retracted requests, so beyond the candidates Feather moved
        to the head its list is sorted by `RequestTracker.order`: a binary search finds the
        request. A list not sorted there (SGLang's own re-sort) fails the identity check and
        falls back to the scan."""
        order = self.lists.figures.order
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
        aborted) since the last admission pass leave the CHT now, not at the next arrival."""
        if self.index.is_empty():
            return
        self._end_pass()
        self.lists.sync(waiting_queue, running)

    def on_step(self, batch_size: int, prefill_tokens: int) -> None:
        """This iteration picked its batch; it runs from now until `end_previous_step`."""
        self._last_step = (self._clock(), batch_size, prefill_tokens)
