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
vLLM's FCFS deque is moved into an `OrderedRequestQueue` first (vllm_queue.py: the same order
under the same operations, but taking the policy's pick from the middle is O(1), not a scan).

Outside `schedule()` (arrivals, preemption, aborts) the queue behaves exactly like the wrapped
one and only mirrors membership into the CHT.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from vllm.v1.core.sched.request_queue import FCFSRequestQueue, RequestQueue
from vllm.v1.request import Request as VllmRequest
from vllm.v1.request import RequestStatus

from feather_sched.host.admission import AdmissionPass, Hosted, PolicyHost
from feather_sched.host.tracker import RequestTracker
from feather_sched.index.cht import ChunkedHashTree
from feather_sched.policies.base import Policy
from feather_sched.request import Request
from feather_sched.vllm.queue import OrderedRequestQueue

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler


class AdmissionController(Hosted):
    """The policy host, the CHT and the view, tied to one vLLM scheduler. vLLM's loop pulls
    each candidate through the queue (`has_next`, `peek`, `pop`); the dialogue with the
    policy is the shared `AdmissionPass` (host/admission.py)."""

    def __init__(self, scheduler: Scheduler, policy: Policy, index: RequestTracker) -> None:
        self.scheduler = scheduler
        self.host = PolicyHost(policy, engine="vLLM")
        self.index = index
        self.view = VllmSchedulerView(self)
        self.queue: FeatherRequestQueue | None = None
        self._armed = False
        self._step: AdmissionPass | None = None
        self._current: VllmRequest | None = None
        self._stop_after_current = False
        self._stopped = False
        self._pending: list[VllmRequest] = []
        self.preemptions = 0
        self._preemptions_before = 0
        """Requests vLLM preempted back into the waiting queue (the KV gate reads it)."""
        self.admission_hits: dict[str, int] = {}
        """Prefix-cache hit tokens of the requests vLLM looked up (or skipped) this step: what
        each found cached when admitted, for the KV gate's put-off probes (kv_gate.py)."""

    # ------------------------------------------------------------------ step bracket
    def begin_schedule(self) -> None:
        self._armed = True
        self._step = self._current = None
        self.admission_hits.clear()
        self._stop_after_current = self._stopped = False
        self._preemptions_before = self.preemptions

    def end_schedule(self) -> None:
        """Close the step: settle popped requests and check the books. A request can reach
        `running` without passing our queue (vLLM's kv_holding_waiting, used by KV
        connectors), or leave it for that queue; the counts then differ and the CHT is
        rebuilt from vLLM's lists (O(requests), only then). A step that preempted nothing
        but never asked the queue for a candidate (vLLM 0.32 enters its waiting loop only
        with token budget left) is the policy's `idle_pass`: nothing was admitted, so the
        cache reads as it did when the loop was skipped."""
        self._settle()
        step, self._step, self._armed = self._step, None, False
        if step is not None:
            step.close()
        sched, cht, queue = self.scheduler, self.index.cht, self._queue()
        if cht.num_running != len(sched.running) or cht.num_waiting != len(queue):
            self.stats.resyncs += 1
            self.index.resync(sched.running, iter(queue), time.time())
        if step is None and queue.inner and self.preemptions == self._preemptions_before:
            self.host.idle(self.view)

    def step_feedback(self, step_time: float, batch_size: int, prefill_tokens: int) -> None:
        """A scheduled step finished: tell the policy (its reward signal)."""
        self.host.feedback(self.view, step_time, batch_size, prefill_tokens)

    # ------------------------------------------------------------------ queue hooks
    def on_enqueue(self, req: VllmRequest) -> None:
        self._settle()
        if req.status == RequestStatus.PREEMPTED:
            self.preemptions += 1
        self.index.waiting(req, time.time())

    def on_dequeue(self, req: VllmRequest) -> None:
        self._settle()
        self.index.park(req.request_id)

    def on_cache_lookup(self, request_id: str, hit_tokens: int) -> None:
        """vLLM looked up the prefix cache to admit this request (`FeatherScheduler.
        _get_local_prefix_cache_hit`): the gate's probe of it, if put off, reads this."""
        self.admission_hits[request_id] = hit_tokens

    def on_finished(self, request_id: str) -> None:
        self._settle()
        self.index.forget(request_id)

    def request(self, request_id: str) -> Request:
        """The request as feather's `Request` for the policy (`SchedulerView.request`): the
        tracker's `RequestView`, made once per request, its prompt copied only if read."""
        return self.index.request(request_id)

    def has_next(self) -> bool:
        """`bool(waiting)` inside the admission loop: is there a candidate to ADD?"""
        self._settle()
        queue = self._queue()
        if not queue.inner:
            return False
        if not self._armed:
            return True
        step = self._step or self._start()
        if self._stopped:
            return False
        if self._current is not None:
            return True
        if self._stop_after_current:
            self._stopped = True
            return False
        sched = self.scheduler
        if len(sched.running) + sched.num_waiting_for_streaming_input >= (
            sched.max_num_active_reqs
        ):
            return True  # vLLM stops on its own capacity check before peeking
        if step.engine_order:
            return True  # vLLM's order: peek gives the queue head
        rid = step.next_candidate()
        if rid is not None and step.accept(rid):
            self._current = queue.members[rid]
            return True
        if step.engine_order:
            return True  # the policy failed: vLLM's order for the rest of the step
        head = step.force_head(len(sched.running), queue.inner.peek_request)
        if head is not None:
            # The policy stopped with nothing running: never stall the engine. vLLM admits
            # the queue head (what FCFS would), as every host does, and stops after it.
            self._stop_after_current = True
            self._current = head
            return True
        self._stopped = True
        return False

    def peek(self) -> VllmRequest:
        if self._armed and self._current is not None:
            return self._current
        return self._queue().inner.peek_request()

    def pop(self) -> VllmRequest:
        queue = self._queue()
        if self._armed and self._current is not None:
            req, self._current = self._current, None
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

    def _start(self) -> AdmissionPass:
        members = self._queue().members
        self._step = self.host.begin(self.view, members.__contains__)
        return self._step

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
                # Its lookup's hit, if vLLM has no `_get_local_prefix_cache_hit` to report it:
                # without a KV connector, what admission set its computed tokens to.
                self.admission_hits.setdefault(req.request_id, req.num_computed_tokens)
            else:
                self.index.park(req.request_id)
                if self._armed and req.request_id not in self.admission_hits:
                    # vLLM skipped it before its lookup; settled by the loop's next
                    # `has_next`, before anything else is allocated, so this probe reads the
                    # cache as the policy's accept saw it.
                    self.admission_hits[req.request_id] = self.view.probe_cache(req)


class FeatherRequestQueue(RequestQueue):
    """vLLM's waiting queue, wrapped: same order, policy-driven admission (vLLM's FCFS deque
    moved into an `OrderedRequestQueue`, so the policy's pick leaves it in O(1))."""

    def __init__(self, inner: RequestQueue, controller: AdmissionController) -> None:
        if type(inner) is FCFSRequestQueue:
            inner = OrderedRequestQueue(inner)
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
        self._stops: bool | None = None
        """Whether vLLM's prefix-cache lookup can stop early (`_walk_stops`), once known."""

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
    def max_num_batched_tokens(self) -> int:
        """vLLM's token budget per step (`SchedulerConfig.max_num_batched_tokens`)."""
        return self._c.scheduler.scheduler_config.max_num_batched_tokens

    @property
    def overlaps_cpu(self) -> bool:
        """Whether vLLM schedules the next step while this one runs (`async_scheduling`)."""
        return bool(self._c.scheduler.scheduler_config.async_scheduling)

    @property
    def num_waiting(self) -> int:
        return len(self._c._queue().inner)

    def waiting_ids(self) -> Iterator[str]:
        return (r.request_id for r in self._c._queue().inner)

    def request(self, request_id: str) -> Request:
        return self._c.request(request_id)

    def arrival_time(self, request_id: str) -> float:
        return self._c.index.entered(request_id)

    def block_hashes(self, request_id: str) -> Sequence[int]:
        return self._c.index.block_digests(request_id)

    # CacheAwareView (policies/vllm_cache_aware.py)
    @property
    def kv_usage(self) -> float:
        return self._c.scheduler.kv_cache_manager.usage

    def is_plain_waiting(self, request_id: str) -> bool:
        """vLLM 0.34's "plain" waiting request: status WAITING, no computed tokens."""
        req = self._c.scheduler.requests.get(request_id)
        return (
            req is not None
            and req.status == RequestStatus.WAITING
            and not (req.num_computed_tokens)
        )

    # KvView (policies/kv_gate.py)
    @property
    def free_kv_blocks(self) -> int:
        return self._c.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    @property
    def num_preemptions(self) -> int:
        return self._c.preemptions

    def running_kv(self) -> Iterator[tuple[int, int, int, bool, int]]:
        # A decoding request has computed all but its newest token; anything more behind
        # is prefill still to do (a prompt, or a preempted request's recompute).
        # Once a step per running request: builtins and attribute reads kept to the minimum.
        for r in self._c.scheduler.running:
            held = r.num_computed_tokens
            prefill = r.num_tokens - 1 - held
            done = r.num_output_tokens
            left = (r.max_tokens or 0) - done
            firm = bool(getattr(r.sampling_params, "ignore_eos", False))
            yield held, prefill if prefill > 0 else 0, left if left > 0 else 0, firm, done

    def cached_blocks(self, request_id: str) -> int:
        """Blocks cached for the request now; for one vLLM looked up this step, what it found
        then (the gate may ask after vLLM has admitted it and cached its new blocks)."""
        hit = self._c.admission_hits.get(request_id)
        if hit is None:
            req = self._c.scheduler.requests.get(request_id)
            hit = 0 if req is None else self.probe_cache(req)
        return hit // self.block_size

    def cached_blocks_upto(self, request_id: str, need: int) -> int:
        """`min(cached_blocks, need)`, vLLM's walk over the prompt's blocks stopped after
        `need` (the KV gate asks only whether that many are cached; kv_gate.py)."""
        hit = self._c.admission_hits.get(request_id)
        if hit is None:
            req = self._c.scheduler.requests.get(request_id)
            hit = 0 if req is None else self.probe_cache(req, need)
        return min(hit // self.block_size, need)

    def probe_cache(self, req: VllmRequest, upto: int | None = None) -> int:
        """Prefix-cache hit tokens if vLLM admitted `req` now: the read-only probe of
        KVCacheManager.get_computed_blocks (vllm/v1/core/kv_cache_manager.py; the last
        token is always recomputed). With `upto` blocks, correct only up to that many: where
        the lookup walks full-attention blocks from the first (`_walk_stops`), it is asked
        for one block more (an EAGLE drafter drops the last one) and stops there."""
        sched = self._c.scheduler
        if not sched.cache_config.enable_prefix_caching:
            return 0
        coordinator = sched.kv_cache_manager.coordinator
        length = req.num_tokens - 1
        if upto is not None and self._walk_stops(coordinator):
            length = min(length, (upto + 1) * self.block_size)
        _, hit_tokens, _ = coordinator.find_longest_cache_hit(req.block_hashes, length)
        return hit_tokens

    def _walk_stops(self, coordinator) -> bool:
        """Whether vLLM's lookup is one walk over full-attention blocks of the hash size from
        the first (vLLM's unitary coordinator over one full-attention group, no context
        parallelism): its hit for a shorter length is then the full hit, cut there. Hybrid
        models and sliding windows search otherwise and are probed whole."""
        if self._stops is None:
            managers = getattr(coordinator, "single_type_managers", ())
            self._stops = (
                type(coordinator).__name__ == "UnitaryKVCacheCoordinator"
                and len(managers) == 1
                and type(managers[0]).__name__ == "FullAttentionManager"
                and getattr(coordinator, "block_size", None) == self.block_size
                and getattr(coordinator, "dcp_world_size", 1) == 1
                and getattr(coordinator, "pcp_world_size", 1) == 1
            )
        return self._stops
