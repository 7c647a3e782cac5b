"""Prefix-grouped admission order from the CHT, with an optional fixed batch cap.

Order: the waiting request sharing the most chunks with the running batch first (so a batch
fills with one prefix group before it mixes in another); when none shares anything, the
oldest waiting request (so nothing starves). With `max_batch` it stops admitting once that
many requests run: the fixed cap the `oracle` bound sweeps, and the order the Feather policy
builds on.
"""

from __future__ import annotations

from collections.abc import Iterator

from feather_sched.policies.base import Policy, SchedulerView


def grouped_candidates(view: SchedulerView) -> Iterator[str]:
    """Live CHT order: best-matching waiting request, else the queue head. Re-evaluated after
    each admission, so the batch's growing prefix steers the next pick."""
    index = view.index
    while True:
        rid = index.best_waiting()
        if rid is None:
            rid = next(view.waiting_ids(), None)
            if rid is None:
                return
        yield rid


class GroupedPolicy(Policy):
    name = "grouped"

    def __init__(self, max_batch: int | None = None) -> None:
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = max_batch

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        return grouped_candidates(view)

    def accept(self, view: SchedulerView, request_id: str) -> bool:
        return self.max_batch is None or view.num_running < self.max_batch

    def follows_queue_order(self, view: SchedulerView) -> bool:
        # No shared chunk anywhere: no best match, so the queue head every time.
        return self.max_batch is None and view.index.num_shared_roots == 0
