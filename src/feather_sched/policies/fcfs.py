"""First come, first served: vLLM's default scheduler, and SGLang's `fcfs` (its default).

vLLM V1 (`vllm/v1/core/sched/scheduler.py`, policy "fcfs") pops the waiting queue in order and
stops at the first request the token budget, `max_num_seqs` or the KV allocator cannot take;
preempted requests are put back at the front. SGLang's `fcfs` leaves its waiting list unsorted
(`SchedulePolicy.calc_priority` returns early), and `PrefillAdder` also stops at the first
request that does not fit. Both reduce to: queue order, always ADD.
"""

from __future__ import annotations

from collections.abc import Iterator

from feather_sched.policies.base import Policy, SchedulerView


class FCFSPolicy(Policy):
    name = "fcfs"

    def follows_queue_order(self, view: SchedulerView) -> bool:
        return True

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        return queue_head(view)


def queue_head(view: SchedulerView) -> Iterator[str]:
    """The engine's own order: the waiting queue as it stands (a snapshot: the host removes
    admitted ids from its queue while the candidates are iterated)."""
    yield from list(_head(view))


def _head(view: SchedulerView, limit: int | None = None) -> Iterator[str]:
    """The first waiting ids in queue order; at most what the step could still admit."""
    cap = view.max_num_seqs if limit is None else limit
    for i, rid in enumerate(view.waiting_ids()):
        if i >= cap:
            return
        yield rid
