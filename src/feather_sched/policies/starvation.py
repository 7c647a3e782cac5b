"""Starvation guard: bound every request's wait without handing the schedule to FCFS.

A policy that reorders admissions (by prefix, say) can leave a request behind forever; the
classic cure, "admit anything older than `max_wait_s` first", breaks under a standing
backlog, where every waiting request is older than any fixed limit: the guard then admits
everything in queue order and the policy becomes FCFS (measured on a long-prompt trace:
24,081 forced admissions against 108 policy decisions). Three rules keep the bound and the
schedule:

- Over-age is relative to load: a request is over-age when it has waited longer than
  `max_wait_s` and `wait_factor` times the mean wait of recent admissions (an exponential
  average), so under a backlog only the requests the policy keeps skipping are over-age,
  not the whole queue.
- Over-age requests get a bounded share of admissions: each admission the policy makes earns
  `share` of a credit (capped at one), each forced admission spends one. So the policy
  keeps at least 1 - `share` of admissions, and the oldest request still moves at a fixed
  fraction of the admission rate: its wait is bounded.
- Only the queue head is looked at (the host's waiting queue is in age order, preempted
  requests first), so the cost per step is O(1) whatever the queue length. A forced head
  that does not fit stays forced until it is admitted (without spending credit again), so a
  large request cannot be overtaken forever by smaller ones, as FCFS guarantees too.
"""

from __future__ import annotations

from feather_sched.policies.base import SchedulerView

WAIT_AVERAGE_WEIGHT = 1 / 64
"""Weight of each admission's wait in the running mean (about the last 64 admissions)."""
MAX_WAIT_S = 60.0
"""Default `max_wait_s`: the wait no request is over-age before, whatever the load."""
STARVATION_SHARE = 0.25
"""Default `share`: over-age requests take at most a quarter of admissions (the simulator
suite does not move at half or double it: benchmarks/feather.md, "The constants, measured")."""
WAIT_FACTOR = 1.0
"""Default `wait_factor`: over-age also means older than the mean recent wait times this
(benchmarks/overload.md: what it changed on the Mooncake trace)."""


class StarvationGuard:
    """Which queue head, if any, a policy must admit first this step (see the module doc)."""

    def __init__(
        self,
        max_wait_s: float = MAX_WAIT_S,
        share: float = STARVATION_SHARE,
        wait_factor: float = WAIT_FACTOR,
    ):
        if max_wait_s <= 0:
            raise ValueError(f"max_wait_s must be > 0, got {max_wait_s}")
        if not 0 < share <= 1:
            raise ValueError(f"starvation share must be in (0, 1], got {share}")
        if wait_factor < 0:
            raise ValueError(f"wait_factor must be >= 0, got {wait_factor}")
        self.max_wait_s = max_wait_s
        self.share = share
        self.wait_factor = wait_factor
        self.reset()

    def reset(self) -> None:
        self.credit = 1.0
        self.mean_wait = 0.0
        self.committed: str | None = None
        self.forced = 0
        """Distinct requests admitted ahead of the policy's order (the run's count)."""

    def limit_s(self) -> float:
        """The wait beyond which a request is over-age now."""
        return max(self.max_wait_s, self.wait_factor * self.mean_wait)

    def pick(self, view: SchedulerView) -> str | None:
        """The request to admit first this step, or None: the queue head when it is over-age
        and credit allows, or still committed from an earlier step."""
        head = next(view.waiting_ids(), None)
        if head is None:
            return None
        if head == self.committed:
            return head
        self.committed = None
        if self.credit < 1 or view.now - view.arrival_time(head) <= self.limit_s():
            return None
        return head

    def admitted(
        self, view: SchedulerView, request_id: str, forced: bool, now: float | None = None
    ) -> None:
        """Record an ADD: its wait feeds the mean, and credit moves. `now`: the step's time,
        where the caller has read it once for all its admissions (else `view.now`)."""
        wait = (view.now if now is None else now) - view.arrival_time(request_id)
        self.mean_wait += WAIT_AVERAGE_WEIGHT * (wait - self.mean_wait)
        if not forced:
            self.credit = min(1.0, self.credit + self.share)
        elif request_id != self.committed:
            self.credit -= 1.0
            self.forced += 1
            self.committed = request_id
