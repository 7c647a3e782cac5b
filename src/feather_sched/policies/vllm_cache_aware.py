"""vLLM's cache-aware admission (`--cache-aware-admission-window`, vLLM 0.34), as a policy.

vLLM 0.34.0 `Scheduler._reorder_waiting_by_cached_prefix` (vllm/v1/core/sched/scheduler.py),
point by point; it runs once a step, after the running requests are served and before the
waiting loop, unless the step preempted a request (`if not preempted_reqs`):

1. fewer than 2 waiting: nothing;
2. KV usage (`BlockPool.get_usage`: 1 - free / total blocks, cached blocks no request holds
   count as free) below `threshold` (`--cache-aware-admission-threshold`, default 0.5): nothing;
3. the window is the first `window` requests of the waiting queue; only its "plain" ones move
   (status WAITING and no computed tokens: not preempted, not blocked); every other request
   keeps its exact position, and the queue beyond the window is untouched;
4. a plain request's key is its cached tokens (`KVCacheManager.get_num_cached_tokens`: a
   read-only prefix-cache probe over all but its last token, in whole blocks);
5. the plain slots are refilled in order of most cached tokens first, ties by position.

The reorder rewrites vLLM's queue, so it persists: ties break by the queue's current order
(arrival order until a reorder moved them), and an order made while the cache was full stays
when usage falls. This policy keeps that queue itself (the host's queue stays in arrival
order): preempted requests enter it at the front and arrivals at the back, as in vLLM. The
waiting loop then admits from its head, as FCFS does, and stops at the first request that does
not fit (always ADD). vLLM turns the window off without prefix caching (every key is then 0:
no request moves here either). Steps where the host has no room to admit still reorder
(`idle_pass`), as vLLM's call precedes its loop.

Window: vLLM's default is 0 (off), and its help names no number ("prefer the smallest window
that spans the usual queue depth"); `DEFAULT_WINDOW` is this repository's choice, from a sweep
of the default bench suite (docs/policies.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, cast

from feather_sched.policies.base import Policy, SchedulerView

__all__ = ["DEFAULT_THRESHOLD", "DEFAULT_WINDOW", "CacheAwareView", "VllmCacheAwarePolicy"]

DEFAULT_THRESHOLD = 0.5
"""vLLM's `cache_aware_admission_threshold` default (SchedulerConfig, 0 <= it <= 1)."""
DEFAULT_WINDOW = 256
"""Requests at the queue's head that may be reordered (vLLM: `cache_aware_admission_window`)."""


class CacheAwareView(Protocol):
    """What the rule reads beside `SchedulerView` (the simulator and the vLLM adapter offer
    both)."""

    @property
    def kv_usage(self) -> float:
        """vLLM's `KVCacheManager.usage`: 1 - free / total KV blocks."""
        ...

    def is_plain_waiting(self, request_id: str) -> bool:
        """Waiting with status WAITING and no computed tokens (never preempted nor blocked)."""
        ...


class VllmCacheAwarePolicy(Policy):
    """vLLM 0.34's cache-aware admission window over an FCFS queue (see the module doc)."""

    name = "vllm-cache-aware"

    def __init__(self, window: int = DEFAULT_WINDOW, threshold: float = DEFAULT_THRESHOLD) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"vllm-cache-aware: window must be an integer >= 0, got {window!r}")
        if isinstance(threshold, bool) or not 0.0 <= float(threshold) <= 1.0:
            raise ValueError(
                f"vllm-cache-aware: threshold must be in [0, 1] (vLLM's range), got {threshold!r}"
            )
        self.window = window
        self.threshold = float(threshold)
        self.reorders = 0
        """Steps whose window this run reordered (vLLM's queue changed)."""
        self._queue: list[str] = []
        """vLLM's waiting queue as the rule leaves it: the host's ids, possibly reordered."""

    def reset(self) -> None:
        self._queue = []
        self.reorders = 0

    def begin_step(self, view: SchedulerView) -> None:
        self._sync(view)
        self._reorder(view)

    def idle_pass(self, view: SchedulerView) -> None:
        self.begin_step(view)

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        index = view.index
        for rid in list(self._queue):
            if rid in index.waiting_set:
                yield rid

    # ------------------------------------------------------------------ internals
    def _sync(self, view: SchedulerView) -> None:
        """Bring the kept queue up to the host's: drop ids that left, put new ids that the
        host has ahead of every kept one (preempted) at the front, the rest (arrivals) at
        the back, each in the host's order."""
        waiting = list(view.waiting_ids())
        known = set(self._queue)
        first_kept = next((i for i, rid in enumerate(waiting) if rid in known), len(waiting))
        back = [rid for rid in waiting[first_kept:] if rid not in known]
        live = set(waiting)
        self._queue = [*waiting[:first_kept], *(r for r in self._queue if r in live), *back]

    def _reorder(self, view: SchedulerView) -> None:
        """`_reorder_waiting_by_cached_prefix`, on the kept queue."""
        queue = self._queue
        if len(queue) < 2 or not self.window:
            return
        cview = cast(CacheAwareView, view)
        if cview.kv_usage < self.threshold:
            return
        head = queue[: self.window]
        slots = [i for i, rid in enumerate(head) if cview.is_plain_waiting(rid)]
        if len(slots) < 2:
            return
        bs = view.block_size
        cached = {i: view.cached_blocks(head[i]) * bs for i in slots}
        order = sorted(slots, key=lambda i: (-cached[i], i))
        if order == slots:
            return
        for slot, source in zip(slots, order, strict=True):
            queue[slot] = head[source]
        self.reorders += 1
