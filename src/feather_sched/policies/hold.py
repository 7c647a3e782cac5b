"""Hold bound: how many steps in a row Feather's KV gate may hold the queue back.

A KV refusal waits for blocks the running requests will free, and so delays the held
requests' first tokens. The engine's own order admits whatever fits now (and preempts later
if it must), so each request gets its first token early; a gate that holds a whole group until
earlier groups finish decoding moves that group's first tokens back by their decode time: on
the real kv-bound vLLM engine, paper-4g under KV pressure, Feather with the unbounded gate ran
1.25x vLLM's throughput at a TTFT p99 of 23.8 s against vLLM's 4.9 s
(benchmarks/vllm-kv-gate.json).

So the gate may hold the queue at most `max_steps` steps in a row; in the next step it is
asked about the gate stands aside (what the engine would admit, it admits), and the count
starts again. Steps count where the host asks the policy, so the bound is in the engine's own
unit, whatever a step lasts on the hardware. `None` holds until the KV fits: more throughput
under KV pressure, knowingly traded for the tail (`feather-hold`).

The bandit's STOPs hold the queue back too. Bounded in steps, as the gate's holds, they cost
64% of Feather's throughput on long-prefix on the free-L2 sensitivity profile
(benchmarks/overload.md, "Holding back, bounded"), so `StopDelay` bounds them in time: the
STOP steps since the oldest waiting request arrived may add up to at most `share` of its wait
(`stop_delay_share`, default `STOP_DELAY_SHARE`), each step counted net of what its STOP saves
the requests behind it (`stop_charge`). On a live vLLM server that kept learning from burst to
burst, unbounded STOPs took the TTFT p99 to 1.7-1.8x vLLM's (1.06-1.56x once the bandit's
evidence faded, bandit.py): a few percent of throughput bought with the tail. Counted whole
(before the netting), a share of 0.2 kept it at 0.95-1.16x, but on the free-L2 profile, where
homogeneous batches decode several times faster and STOPs shorten every wait, it gave up half
or more of the estimated gain; netted, the STOPs that halve the batch's time are free, and the
profile keeps all of it on two of the four rows, 71% and 24% of it on the other two, never
below FCFS (benchmarks/replay.md, "The STOP delay bound by default"). `feather-hold` leaves
STOPs unbounded, as it leaves the gate's holds: the tail traded knowingly.

Some bursts outgrow the KV cache whatever the order: with a tail within 1.5x of the
engine's, every request starts before any can finish, so the engine must preempt, and no
bound that keeps the tail avoids it. The authors' policies avoid it only by starting their
last group late (benchmarks/paper-policies.md, "Why the default cannot have both on this
row"). A bound in seconds tied to the 1.5x rule was measured too (benchmarks/hold_clock.py)
and changed nothing there.
"""

from __future__ import annotations

import math
from collections import deque

MAX_HOLD_STEPS = 4
"""Default bound, in steps: the largest of 2, 4, 8 that keeps Feather's TTFT p99 within 1.5x
of FCFS's on every kv-bound row in the simulator with the real engine's fitted profile (an
unbounded hold reaches 6x; benchmarks/overload.md)."""


STOP_DELAY_SHARE = 0.2
"""Default `stop_delay_share`: the most of the oldest waiting request's wait that STOPs, net
of what they save (`stop_charge`), may hold it back (measured: benchmarks/replay.md, "The
STOP delay bound by default")."""


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
    bandit's reward, a step's throughput, does not see it: on a live vLLM server whose table
    kept an early burst's ADD evidence (before the bandit's evidence faded) it settled on
    STOP for every large batch, TTFT p99 1.7-1.8x vLLM's at about the same throughput. The
    bound: a STOP is allowed only while the STOP steps since the queue head arrived, each net
    of its lead (`stop_charge`), add up to at most `share` of its wait (or of the recent
    admissions' mean wait, if longer: a request that has just arrived is not the tail). It
    bounds the delay STOPs add to the oldest request, whatever the table has learned; O(1) a
    step (a queue of STOP steps' start times, trimmed as the head moves on). The netting is
    per STOP: where many STOPs of modest lead add up to a large gain (the free-L2 profile's
    paper-20g), the bound still vetoes some and gives part of the gain up."""

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
