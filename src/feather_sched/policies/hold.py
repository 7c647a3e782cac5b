"""Hold bounds: how long Feather may hold the queue back, for KV or for a STOP.

A KV refusal (`kv_gate`) waits for blocks the running requests will free, delaying the held
requests' first tokens, where the engine's own order admits whatever fits now. So the gate
may hold the queue at most `max_steps` steps in a row (`HoldBound`, counted in the host's own
steps); then it stands aside for a step. The bandit's STOPs hold the queue back too, and its
reward does not see it: `StopDelay` bounds in time how much of the oldest waiting request's
wait STOPs may take, each STOP step counted net of what it saves the requests behind it
(`stop_charge`). `None` leaves either unbounded (`feather-hold`: the tail traded knowingly).
"""

from __future__ import annotations

import math
from collections import deque

MAX_HOLD_STEPS = 4
"""Default bound, in steps: the largest that keeps Feather's TTFT p99 within 1.5x of FCFS's
on the simulator's kv-bound rows."""


STOP_DELAY_SHARE = 0.2
"""Default `stop_delay_share`: the most of the oldest waiting request's wait that STOPs, net
of what they save (`stop_charge`), may hold it back."""


class HoldBound:
    """Counts the steps in a row that held the queue back; says when a step must not."""

    def __init__(self, max_steps: int | None = MAX_HOLD_STEPS) -> None:
        if max_steps is not None and max_steps < 0:
            raise ValueError(f"max_hold_steps must be >= 0 or None, got {max_steps}")
        self.max_steps = max_steps
        self.reset()

    def reset(self) -> None:
        self.streak = 0
        self.releases = 0
        """Steps taken in the engine's order because the bound was reached (this run)."""
        self._held_now = False

    def begin_step(self) -> bool:
        """A new step. True: it must follow the engine's order (the bound is reached)."""
        self.streak = self.streak + 1 if self._held_now else 0
        self._held_now = False
        if self.max_steps is None or self.streak < self.max_steps:
            return False
        self.streak = 0
        self.releases += 1
        return True

    def held(self) -> None:
        """This step held the queue back (the gate refused a candidate)."""
        self._held_now = True


def stop_charge(lead: float) -> float:
    """The share of a STOP step's time that counts as holding the queue back.

    A STOP leading ADD by `lead` (`bandit.Choice.lead`: a step-time saving relative to ADD's
    plan) runs the batch's work in 1 - lead of the time ADD would take, so each of its
    seconds saves lead / (1 - lead) seconds of the work queued behind the batch. The held
    request waits the step out, and every later start comes that much sooner; the step
    counts net of that saving: whole for a STOP not known to win (lead 0: an exploring STOP),
    nothing from a lead of 1/2 on (the batch's work done in half the time)."""
    if lead <= 0.0:
        return 1.0
    if lead >= 0.5:
        return 0.0
    return 1.0 - lead / (1.0 - lead)


class StopDelay:
    """How long the bandit's STOPs have held the queue back; says when one more would push
    the tail (`share` None: never).

    A STOP ends a step's admissions, so every waiting request waits that step out, and the
    bandit's reward, a step's throughput, does not see it. A STOP is allowed only while the
    STOP steps since the queue head arrived, each net of its lead (`stop_charge`), add up to
    at most `share` of its wait (or of the recent admissions' mean wait, if longer: a request
    that has just arrived is not the tail), whatever the table has learned. O(1) a step (a
    queue of STOP steps' start times, trimmed as the head moves on)."""

    def __init__(self, share: float | None = None) -> None:
        if share is not None and not 0 <= share < 1:
            raise ValueError(f"stop_delay_share must be in [0, 1) or None, got {share}")
        self.share = share
        self.reset()

    def reset(self) -> None:
        self.held_s = 0.0
        """Seconds of steps a STOP ended, each net of its lead (`stop_charge`), this run."""
        self._marks: deque[tuple[float, float]] = deque([(-math.inf, 0.0)])
        self._stopped_at: float | None = None
        self._charge = 1.0
        self.vetoes = 0
        """Candidates the bound kept from the table (ADDed unasked: no STOP allowed then),
        this run."""

    def stopped(self, now: float, lead: float = 0.0) -> None:
        """The step starting at `now` ended its admissions with a STOP leading ADD by `lead`
        (`stop_charge`; of several STOPs in one step, the least lead counts)."""
        charge = stop_charge(lead)
        if self._stopped_at is None:
            self._stopped_at, self._charge = now, charge
        else:
            self._charge = max(self._charge, charge)

    def end_step(self, step_time: float) -> None:
        """A step ended, lasting `step_time`: a STOP step's time, net of what its lead saved
        (`stop_charge`), is held time for the requests that were waiting when it started."""
        at, self._stopped_at = self._stopped_at, None
        if at is not None and step_time > 0:
            self.held_s += step_time * self._charge
            self._marks.append((at, self.held_s))

    def allows(self, now: float, head_arrival: float, mean_wait: float) -> bool:
        """May the policy STOP now, with the oldest waiting request in since `head_arrival`?"""
        if self.share is None:
            return True
        marks = self._marks
        while len(marks) > 1 and marks[1][0] <= head_arrival:
            marks.popleft()
        held = self.held_s - marks[0][1]
        if held <= self.share * max(now - head_arrival, mean_wait):
            return True
        self.vetoes += 1
        return False
