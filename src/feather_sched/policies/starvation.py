"""Starvation guard: bound every request's wait without handing the schedule to FCFS.

"Admit anything older than `max_wait_s` first" turns a policy into FCFS under a standing
backlog, where every request is that old. So over-age is relative to load (older than
`max_wait_s` and `wait_factor` x the recent mean wait); over-age requests get at most `share`
of admissions (a credit each policy admission earns, each forced one spends), which still
bounds the oldest request's wait; and only the queue head is read (O(1) a step). A forced
head that does not fit stays forced until admitted, so it cannot be overtaken forever.
"""

from __future__ import annotations

from feather_sched.policies.base import SchedulerView, require

WAIT_AVERAGE_WEIGHT = 1 / 64
"""Weight of each admission's wait in the running mean (about the last 64 admissions)."""
MAX_WAIT_S = 60.0
"""Default `max_wait_s`: the wait no request is over-age before, whatever the load."""
STARVATION_SHARE = 0.25
"""Default `share`: over-age requests take at most a quarter of admissions."""
WAIT_FACTOR = 1.0
"""Default `wait_factor`: over-age also means older than the mean recent wait times this."""


class StarvationGuard:
    """Which queue head, if any, a policy must admit first this step (see the module doc)."""

    def __init__(
        self,
        max_wait_s: float = MAX_WAIT_S,
        share: float = STARVATION_SHARE,
        wait_factor: float = WAIT_FACTOR,
    ):
        require(max_wait_s > 0, f"max_wait_s must be > 0, got {max_wait_s}")
        require(0 < share <= 1, f"starvation share must be in (0, 1], got {share}")
        require(wait_factor >= 0, f"wait_factor must be >= 0, got {wait_factor}")
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
