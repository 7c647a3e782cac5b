"""Host a feather Policy inside vLLM's admission loop, through the waiting queue alone.

vLLM 0.32's `Scheduler.schedule()` (vllm/v1/core/sched/scheduler.py, "Next, schedule the
WAITING requests") admits with this loop over `self.waiting`:

    while token_budget > 0:
        if not queue: break                              # -> FeatherRequestQueue.__bool__
        if len(running) >= max_num_active_reqs: break
        request = queue.peek_request()                   # -> the policy's candidate
        ... skip_request(): queue.pop_request(), re-queued after the loop via
            queue.prepend_requests()
        ... allocate_slots() is None: break              # first non-fit stops, as in the sim
        queue.pop_request(); running.append(request); request.status = RUNNING

So the queue is the whole hook: `__bool__` asks the policy for its next candidate and its
ADD/STOP (False = STOP), `peek_request`/`pop_request` hand that candidate to vLLM, and vLLM
keeps owning memory, budgets and the request objects. The queue stores nothing itself: it
wraps the queue vLLM built (`create_request_queue`), so a request can never be lost or
duplicated by the policy; a policy that raises or breaks the contract (unknown or repeated id,
PolicyError as in the simulator) is logged once and the step continues in vLLM's FCFS order.

Outside `schedule()` (arrivals, preemption, aborts) the queue behaves exactly like the wrapped
one and only mirrors membership into the CHT.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request as VllmRequest
from vllm.v1.request import RequestStatus

from feather_sched.index.cht import ChunkedHashTree
from feather_sched.integrations.engine_index import EngineIndex
from feather_sched.policies.base import Policy, PolicyError
from feather_sched.request import Request

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

logger = logging.getLogger("feather_sched.vllm")


@dataclass
class AdmissionStats:
    """Counters a test or a benchmark can read off the live scheduler."""

    policy_steps: int = 0
    """Steps whose admission the policy drove (at least one candidate asked for)."""
    queue_order_steps: int = 0
    """Steps left to vLLM's own order because the policy said it would follow it
    (`Policy.follows_queue_order`: e.g. nothing shared, or FCFS)."""
    admitted: int = 0
    policy_errors: int = 0
    forced: int = 0
    """Queue heads admitted because the policy stopped while nothing was running."""
    resyncs: int = 0
    """Times the CHT had drifted from vLLM's queues and was rebuilt (should stay 0)."""
    feedback_steps: int = 0
    last_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Session:
    """One admission loop (one `schedule()` call)."""

    candidates: Iterator[str] | None  # None: FCFS for the rest of this step
    seen: set[str] = field(default_factory=set)
    current: VllmRequest | None = None
    stop_after_current: bool = False
    stopped: bool = False


class AdmissionController:
    """The policy, the CHT and the view, tied to one vLLM scheduler."""

    def __init__(self, scheduler: Scheduler, policy: Policy, index: EngineIndex) -> None:
        self.scheduler = scheduler
        self.policy = policy
        self.index = index
        self.stats = AdmissionStats()
        self.view = VllmSchedulerView(self)
        self.queue: FeatherRequestQueue | None = None
        self._armed = False
        self._session: _Session | None = None
        self._pending: list[VllmRequest] = []

    # ------------------------------------------------------------------ step bracket
    def begin_schedule(self) -> None:
        self._armed = True
        self._session = None

    def end_schedule(self) -> None:
        """Close the step: settle popped requests and check the books. A request can reach
        `running` without passing our queue (vLLM's kv_holding_waiting, used by KV
        connectors), or leave it for that queue; the counts then differ and the CHT is
        rebuilt from vLLM's lists (O(requests), only then)."""
        self._settle()
        session, self._session, self._armed = self._session, None, False
        if session is not None and session.candidates is not None:
            close = getattr(session.candidates, "close", None)
            if close is not None:
                close()
        sched, cht, queue = self.scheduler, self.index.cht, self._queue()
        if cht.num_running != len(sched.running) or cht.num_waiting != len(queue):
            self.stats.resyncs += 1
            self.index.resync(sched.running, iter(queue), time.time())

    def step_feedback(self, step_time: float, batch_size: int, prefill_tokens: int) -> None:
        """A scheduled step finished: tell the policy (its reward signal)."""
        self.stats.feedback_steps += 1
        try:
            self.policy.end_step(self.view, step_time, batch_size, prefill_tokens)
        except Exception as err:
            self._policy_failed(err)

    # ------------------------------------------------------------------ queue hooks
    def on_enqueue(self, req: VllmRequest) -> None:
        self._settle()
        self.index.waiting(req, time.time())

    def on_dequeue(self, req: VllmRequest) -> None:
        self._settle()
        self.index.park(req.request_id)

    def on_finished(self, request_id: str) -> None:
        self._settle()
        self.index.forget(request_id)

    def has_next(self) -> bool:
        """`bool(waiting)` inside the admission loop: is there a candidate to ADD?"""
        self._settle()
        queue = self._queue()
        if not queue.inner:
            return False
        if not self._armed:
            return True
        s = self._session or self._start()
        if s.stopped:
            return False
        if s.current is not None:
            return True
        if s.stop_after_current:
            s.stopped = True
            return False
        sched = self.scheduler
        if len(sched.running) + sched.num_waiting_for_streaming_input >= (
            sched.max_num_active_reqs
        ):
            return True  # vLLM stops on its own capacity check before peeking
        if s.candidates is None:
            return True  # FCFS: peek gives the queue head
        try:
            req = self._next_accepted(s)
        except Exception as err:  # a policy must never take the engine down
            self._policy_failed(err)
            s.candidates = None
            return True
        if req is not None:
            s.current = req
            return True
        if not sched.running:
            # The policy stopped with nothing running: never stall the engine. Admit the
            # queue head (what FCFS would), as the simulator does, and stop after it.
            self.stats.forced += 1
            s.stop_after_current = True
            s.current = queue.inner.peek_request()
            return True
        s.stopped = True
        return False

    def peek(self) -> VllmRequest:
        s = self._session
        if self._armed and s is not None and s.current is not None:
            return s.current
        return self._queue().inner.peek_request()

    def pop(self) -> VllmRequest:
        queue = self._queue()
        s = self._session
        if self._armed and s is not None and s.current is not None:
            req, s.current = s.current, None
            queue.take(req)
        else:
            req = queue.inner.pop_request()
            queue.members.pop(req.request_id, None)
        self._pending.append(req)
        return req

    # ------------------------------------------------------------------ internals
    def _queue(self) -> FeatherRequestQueue:
        assert self.queue is not None, "FeatherRequestQueue not attached"
        return self.queue

    def _start(self) -> _Session:
        candidates: Iterator[str] | None = None
        try:
            if self.policy.follows_queue_order(self.view):
                # The policy would admit in vLLM's own order this step: let vLLM's loop run
                # on its queue untouched (no per-candidate work; nothing shared to lose).
                self.stats.queue_order_steps += 1
            else:
                self.stats.policy_steps += 1
                self.policy.begin_step(self.view)
                candidates = iter(self.policy.candidates(self.view))
        except Exception as err:
            self._policy_failed(err)
            candidates = None
        self._session = _Session(candidates)
        return self._session

    def _next_accepted(self, s: _Session) -> VllmRequest | None:
        """The policy's next candidate if it says ADD; None for STOP or no more candidates.
        Raises PolicyError on a contract breach (as the simulator's `_admit`)."""
        assert s.candidates is not None
        rid = next(s.candidates, None)
        if rid is None:
            return None
        if rid in s.seen:
            raise PolicyError(f"policy {self.policy.name!r} proposed {rid!r} twice in one step")
        req = self._queue().members.get(rid)
        if req is None:
            raise PolicyError(f"policy {self.policy.name!r} proposed {rid!r} that is not waiting")
        s.seen.add(rid)
        return req if self.policy.accept(self.view, rid) else None

    def _policy_failed(self, err: BaseException) -> None:
        self.stats.policy_errors += 1
        self.stats.last_error = f"{type(err).__name__}: {err}"
        if self.stats.policy_errors == 1:
            logger.exception(
                "feather policy %r failed; this step continues in vLLM's FCFS order "
                "(logged once; later failures are only counted)",
                self.policy.name,
                exc_info=err,
            )

    def _settle(self) -> None:
        """Requests popped since the last hook either run now (admitted) or were skipped
        by vLLM (they come back through prepend_requests, or move to another queue)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        now = time.time()
        for req in pending:
            if req.status == RequestStatus.RUNNING:
                self.index.running(req, now)
                self.stats.admitted += 1
            else:
                self.index.park(req.request_id)


class FeatherRequestQueue(RequestQueue):
    """vLLM's waiting queue, wrapped: same storage and order, policy-driven admission."""

    def __init__(self, inner: RequestQueue, controller: AdmissionController) -> None:
        self.inner = inner
        self.members: dict[str, VllmRequest] = {r.request_id: r for r in inner}
        self.controller = controller
        controller.queue = self
        for r in inner:
            controller.on_enqueue(r)

    def take(self, req: VllmRequest) -> None:
        """Remove one specific request (the policy's pick), fast when it is the head."""
        if self.inner.peek_request() is req:
            self.inner.pop_request()
        else:
            self.inner.remove_request(req)
        del self.members[req.request_id]

    # RequestQueue API (vllm/v1/core/sched/request_queue.py)
    def add_request(self, request: VllmRequest) -> None:
        self.inner.add_request(request)
        self.members[request.request_id] = request
        self.controller.on_enqueue(request)

    def pop_request(self) -> VllmRequest:
        return self.controller.pop()

    def peek_request(self) -> VllmRequest:
        return self.controller.peek()

    def prepend_request(self, request: VllmRequest) -> None:
        self.inner.prepend_request(request)
        self.members[request.request_id] = request
        self.controller.on_enqueue(request)

    def prepend_requests(self, requests: Iterable[VllmRequest]) -> None:
        reqs = list(requests)
        self.inner.prepend_requests(reqs)
        for r in reqs:
            self.members[r.request_id] = r
            self.controller.on_enqueue(r)

    def remove_request(self, request: VllmRequest) -> None:
        self.inner.remove_request(request)
        self.members.pop(request.request_id, None)
        self.controller.on_dequeue(request)

    def remove_requests(self, requests: Iterable[VllmRequest]) -> None:
        reqs = list(requests)
        self.inner.remove_requests(reqs)
        for r in reqs:
            if self.members.pop(r.request_id, None) is not None:
                self.controller.on_dequeue(r)

    def __bool__(self) -> bool:
        return self.controller.has_next()

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[VllmRequest]:
        return iter(self.inner)


class VllmSchedulerView:
    """`SchedulerView` (policies/base.py) over a live vLLM scheduler."""

    def __init__(self, controller: AdmissionController) -> None:
        self._c = controller

    @property
    def now(self) -> float:
        return time.time()  # the clock of vLLM's Request.arrival_time

    @property
    def index(self) -> ChunkedHashTree:
        return self._c.index.cht

    @property
    def block_size(self) -> int:
        return self._c.index.block_size

    @property
    def max_num_seqs(self) -> int:
        return self._c.scheduler.max_num_active_reqs

    @property
    def num_running(self) -> int:
        return len(self._c.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self._c._queue().inner)

    def waiting_ids(self) -> Iterator[str]:
        return (r.request_id for r in self._c._queue().inner)

    def request(self, request_id: str) -> Request:
        return self._c.index.request(request_id)

    def arrival_time(self, request_id: str) -> float:
        return self._c.index.entered(request_id)

    def block_hashes(self, request_id: str) -> Sequence[int]:
        return self._c.index.block_digests(request_id)

    def cached_blocks(self, request_id: str) -> int:
        sched = self._c.scheduler
        req = sched.requests.get(request_id)
        if req is None or not sched.cache_config.enable_prefix_caching:
            return 0
        # Read-only probe, as KVCacheManager.get_computed_blocks does it (the last token is
        # always recomputed): vllm/v1/core/kv_cache_manager.py.
        _, hit_tokens, _ = sched.kv_cache_manager.coordinator.find_longest_cache_hit(
            req.block_hashes, req.num_tokens - 1
        )
        return hit_tokens // self.block_size
