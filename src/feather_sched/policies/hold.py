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

Only the gate's holds are bounded. The bandit's STOPs hold a group back too, but they are the
paper's mechanism, taken only with confidence or a model's prior and under the starvation
guard; bounding them the same way cost 64% of Feather's throughput on long-prefix where
homogeneity pays (the free-L2 sensitivity profile), with no tail at stake there.
Measured: benchmarks/overload.md, "Holding back, bounded".

Some bursts outgrow the KV cache whatever the order: with a tail within 1.5x of the
engine's, every request starts before any can finish, so the engine must preempt, and no
bound that keeps the tail avoids it. The authors' policies avoid it only by starting their
last group late (benchmarks/paper-policies.md, "Why the default cannot have both on this
row"). A bound in seconds tied to the 1.5x rule was measured too (benchmarks/hold_clock.py)
and changed nothing there.
"""

from __future__ import annotations

MAX_HOLD_STEPS = 4
"""Default bound, in steps: the largest of 2, 4, 8 that keeps Feather's TTFT p99 within 1.5x
of FCFS's on every kv-bound row in the simulator with the real engine's fitted profile (an
unbounded hold reaches 6x; benchmarks/overload.md)."""


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
