"""vLLM's cache-aware admission (`--cache-aware-admission-window`, vLLM 0.34), as a policy.

Faithful to vLLM 0.34.0's source point by point (which requests move, when, in what order):
docs/policies.md, "`vllm-cache-aware`, point by point"."""

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
