"""What each step of a live vLLM scheduler was: its batch, its preemptions, its exact shape.

The bench and the calibration both read steps through `StepProbe`, so they agree on what a
step was.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable

from feather_sched.cost import BatchShape


def step_shape(sched, output) -> BatchShape:
    """The step's BatchShape from vLLM's state right after `schedule()` (which has already
    advanced num_computed_tokens by the scheduled tokens: vllm/v1/core/sched/scheduler.py
    `_update_after_schedule`). Block ids come from `KVCacheManager.get_block_ids`: requests
    sharing a cached prefix hold the same physical blocks, so sharing is read, not assumed."""
    bs = sched.block_size
    tables, contexts = [], []
    prefill_tokens = prefill_pairs = prefill_seqs = 0
    for rid, n in output.num_scheduled_tokens.items():
        req = sched.requests[rid]
        context = req.num_computed_tokens
        before = context - n
        tables.append(sched.kv_cache_manager.get_block_ids(rid)[0][: math.ceil(context / bs)])
        contexts.append(context)
        if before < req.num_tokens - 1:
            prefill_tokens += n
            prefill_pairs += n * before + n * (n + 1) // 2
            prefill_seqs += 1
    return BatchShape.from_block_tables(
        tables,
        bs,
        contexts,
        num_prefill_tokens=prefill_tokens,
        prefill_attn_pairs=prefill_pairs,
        num_prefill_seqs=prefill_seqs,
    )


class StepProbe:
    """Wraps a live scheduler's `schedule` / `_preempt_request` to see each step as the
    scheduler made it: counts (steps, batch sizes, prefix groups when `group_of` is given,
    preemptions, time in `schedule`) and, with `record_shapes`, each step's exact BatchShape.
    The bench and the calibration both read steps through it, so they agree on what a step
    was. A context manager: leaving it restores the scheduler's own methods."""

    def __init__(
        self,
        sched,
        group_of: Callable[[str], str | None] | None = None,
        record_shapes: bool = False,
    ) -> None:
        self.sched = sched
        self.group_of = group_of
        self.shapes: list[BatchShape] | None = [] if record_shapes else None
        self.steps = 0
        self.batch = 0
        self.groups = 0
        self.preempted: Counter[str] = Counter()  # request id -> times preempted
        self.preempted_kv_tokens = 0
        self.sched_s = 0.0
        self._schedule = sched.schedule
        self._preempt = sched._preempt_request
        sched.schedule = self._on_schedule
        sched._preempt_request = self._on_preempt

    def __enter__(self) -> StepProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_schedule(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self._schedule(*args, **kwargs)
        self.sched_s += time.perf_counter() - t0
        ids = out.num_scheduled_tokens
        if ids:
            self.steps += 1
            self.batch += len(ids)
            if self.group_of is not None:
                self.groups += len({self.group_of(r) for r in ids})
            if self.shapes is not None:
                self.shapes.append(step_shape(self.sched, out))
        return out

    def _on_preempt(self, request, *args, **kwargs):
        self.preempted[request.request_id] += 1
        self.preempted_kv_tokens += request.num_computed_tokens  # dropped, to be recomputed
        return self._preempt(request, *args, **kwargs)

    def close(self) -> None:
        del self.sched.schedule
        del self.sched._preempt_request
