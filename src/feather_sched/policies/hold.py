"""Hold bound: how many steps in a row Feather may end admission before the engine would.

Every way Feather says "not now" delays first tokens: a STOP that keeps a new prefix group
out of the batch, a KV-gate refusal that waits for blocks the running requests will free.
The engine's own order admits whatever fits now (and preempts later if it must), so each
request gets its first token early. A hold that lasts until earlier groups finish decoding
moves a whole group's first tokens back by that decode time: on the real kv-bound vLLM
engine, paper-4g under KV pressure, Feather with an unbounded gate ran 1.25x vLLM's
throughput at a TTFT p99 of 23.8 s against vLLM's 4.9 s (benchmarks/vllm-kv-gate.json).

So Feather may hold the queue at most `max_steps` steps in a row; the next step it is asked
about is taken in the engine's order (every candidate the engine would admit, admitted), and
the count starts again. Steps count where the host asks the policy, so the bound is in the
engine's own unit, whatever a step lasts on the hardware. `None` holds as long as the policy
likes: more throughput under KV pressure, knowingly traded for the tail (`feather-hold`).
Measured: benchmarks/overload.md, "Holding back, bounded".
"""

from __future__ import annotations

MAX_HOLD_STEPS = 8
"""Default bound, in steps. In the simulator with the fitted kv-bound profile (the real
engine's) it keeps Feather's TTFT p99 within 1.5x of FCFS's on every kv-bound row, where an
unbounded hold reaches 6x (benchmarks/overload.md)."""


class HoldBound:
    """Counts the steps in a row that ended with a hold; says when a step must not hold."""

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
        """This step ended admission early (a STOP or a refusal)."""
        self._held_now = True
