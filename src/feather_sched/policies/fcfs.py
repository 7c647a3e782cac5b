"""First come, first served: vLLM's default scheduler, and SGLang's `fcfs` (its default).

vLLM V1 (`vllm/v1/core/sched/scheduler.py`, policy "fcfs") pops the waiting queue in order and
stops at the first request the token budget, `max_num_seqs` or the KV allocator cannot take;
preempted requests are put back at the front. SGLang's `fcfs` leaves its waiting list unsorted
(`SchedulePolicy.calc_priority` returns early), and `PrefillAdder` also stops at the first
request that does not fit. Both reduce to: queue order, always ADD.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

from feather_sched.policies.base import Policy, SchedulerView


class FCFSPolicy(Policy):
    name = "fcfs"

    def follows_queue_order(self, view: SchedulerView) -> bool:
        return True

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        return queue_head(view)


FIRST_READ = 16
"""Waiting ids `queue_head` reads at first; each later read takes twice as many."""


def queue_head(view: SchedulerView) -> Iterator[str]:
    """The engine's own order: the waiting queue as it stands, at most `max_num_seqs` ids.

    Read in snapshots (the host removes admitted ids from its queue while the candidates are
    iterated) of 16 ids, then twice as many each time, each skipping the ids already yielded.
    A step admits only as many as its free slots, often a few, so one snapshot of
    `max_num_seqs` ids would mostly be read for nothing."""
    cap, yielded, size = view.max_num_seqs, set(), FIRST_READ
    while len(yielded) < cap:
        fresh = (rid for rid in view.waiting_ids() if rid not in yielded)
        batch = list(islice(fresh, min(size, cap - len(yielded))))
        if not batch:
            return
        yielded.update(batch)
        yield from batch
        size *= 2
