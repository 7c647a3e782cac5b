"""What a request will still decode, when the engine knows only its cap.

A client sets `max_tokens` and the answer ends at EOS below it; the engine learns the true
length only under `ignore_eos`. The KV gate and the cost prior then price an output from the
run's own finished requests: each finished output as a share of its cap, the most recent
`WINDOW` kept sorted. A request that has already decoded `g` of its cap `c` is priced from
the finished outputs that ran past `g / c` of theirs (those it may still be like): their
`QUANTILE`-th share, less what it has decoded; past every one seen, its whole cap. Until
`MIN_SEEN` requests have finished there is no estimate (the caller keeps its own prior).
A host offers the finished outputs as `finished_outputs` (a growing sequence of (output
tokens, cap)); without it nothing is learned.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections import deque

from feather_sched.policies.base import SchedulerView
from feather_sched.request import Request

WINDOW = 512
"""Finished outputs kept (the most recent): the run's traffic may drift."""
QUANTILE = 0.9
"""The share of the outputs like it that a request's KV bound covers: the gate is there to
avoid preemption, and a request past the bound is the exception it allows."""
MIN_SEEN = 16
"""Finished outputs needed before the run's own estimate replaces the caller's prior."""


class OutputEstimate:
    """Finished outputs relative to their caps, for pricing outputs still to come."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """A new run: nothing seen."""
        self._sorted: list[float] = []
        self._recent: deque[float] = deque()
        self._read = 0
        self._total = 0.0

    @property
    def ready(self) -> bool:
        return len(self._sorted) >= MIN_SEEN

    def update(self, view: SchedulerView) -> None:
        """Read the outputs the host has seen finish since the last update."""
        finished = getattr(view, "finished_outputs", None)
        if finished is None or len(finished) <= self._read:
            return
        for output, cap in finished[self._read :]:
            self.observe(output, cap)
        self._read = len(finished)

    def observe(self, output: int, cap: int) -> None:
        """A request finished with `output` tokens under a cap of `cap`."""
        share = min(1.0, output / cap) if cap > 0 else 1.0
        insort(self._sorted, share)
        self._recent.append(share)
        self._total += share
        if len(self._recent) > WINDOW:
            old = self._recent.popleft()
            del self._sorted[bisect_right(self._sorted, old) - 1]
            self._total -= old

    def remaining(self, generated: int, cap: int) -> int:
        """Tokens still to decode, at `QUANTILE` of the finished outputs that ran past this
        request's share of its cap (its whole remaining cap past all of them)."""
        left = cap - generated
        if left <= 0:
            return 0
        shares = self._sorted
        past = bisect_right(shares, generated / cap)
        tail = len(shares) - past
        if tail <= 0:
            return left
        share = shares[past + max(0, math.ceil(QUANTILE * tail) - 1)]
        return min(left, max(1, math.ceil(share * cap) - generated))

    def expected(self, cap: int) -> float:
        """The mean output of a request with cap `cap` (the cap itself before `ready`)."""
        if not self.ready:
            return float(cap)
        return cap * self._total / len(self._recent)


def expected_output(request: Request, outputs: OutputEstimate | None) -> float:
    """The output a request will decode, as the scheduler can know it: its length where that
    is firm, else the mean the run has seen under its cap (`expected`; the cap without one)."""
    if outputs is None or request.meta.get("firm_output", True):
        return float(request.output_len)
    return outputs.expected(request.output_len)
