"""A hold bound in time instead of steps, tried and not adopted: what it does on the KV rows.

Feather's KV gate may hold the queue `MAX_HOLD_STEPS` (4) steps in a row (policies/hold.py).
The alternative measured here ties the bound to the tail rule itself (TTFT p99 within 1.5x of
the engine's order): a request's time to first token in the engine's order is about what it
waited while the gate was not holding, plus one prefill step; holding it for at most `share`
(0.5 for the 1.5x rule) of that keeps its first token within 1 + `share` of it. So the bound
is a hold clock (seconds of steps in which the gate held the queue) and a step releases the
gate when the queue head's held seconds exceed `share` x (its other waiting seconds + the
last prefill step's duration). Same rows as hold_bound.py (the real kv-bound engine's
workloads and KV pressure, its calibrated profile); deterministic.
Usage: python benchmarks/feather/hold_clock.py OUT.json [--shares 0.25,0.5]
"""

from __future__ import annotations

import argparse
import bisect
from collections.abc import Callable
from pathlib import Path

from hold_bound import Run, sweep

from feather_lab.bench.record import write_record
from feather_sched.cost import StepCostModel
from feather_sched.policies.base import SchedulerView
from feather_sched.policies.feather import FeatherPolicy


class HoldClock:
    """`HoldBound`'s interface, bounded in seconds relative to the head's other wait."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.view: SchedulerView | None = None
        self.last_prefill_s = 0.0
        self.reset()

    def reset(self) -> None:
        self.releases = 0
        self._clock = 0.0  # seconds of steps that held the queue back
        self._times: list[float] = []  # step starts and the clock there, to read it at arrival
        self._clocks: list[float] = []
        self._last: float | None = None
        self._held_now = False

    def begin_step(self) -> bool:
        view = self.view
        assert view is not None
        now = view.now
        if self._held_now and self._last is not None:
            self._clock += now - self._last
        self._held_now, self._last = False, now
        self._times.append(now)
        self._clocks.append(self._clock)
        head = next(view.waiting_ids(), None)
        if head is None:
            return False
        arrival = view.arrival_time(head)
        i = bisect.bisect_left(self._times, arrival)
        held = self._clock - (self._clocks[i] if i < len(self._clocks) else self._clock)
        other = now - arrival - held
        if held > self.share * (other + self.last_prefill_s):
            self.releases += 1
            return True
        return False

    def held(self) -> None:
        self._held_now = True


class ClockFeather(FeatherPolicy):
    """Feather with `HoldClock` in place of the step bound."""

    def __init__(self, share: float, **options) -> None:
        super().__init__(**options)
        self.hold = HoldClock(share)

    def begin_step(self, view: SchedulerView) -> None:
        self.hold.view = view
        super().begin_step(view)

    def end_step(self, view, step_time, batch_size, prefill_tokens=0) -> None:
        super().end_step(view, step_time, batch_size, prefill_tokens)
        if prefill_tokens > 0:
            self.hold.last_prefill_s = step_time


def _runs(shares: list[float]) -> Callable[[StepCostModel], list[Run]]:
    def runs(cost: StepCostModel) -> list[Run]:
        clocks = [
            ({"bound": f"clock:{share:g}"}, ClockFeather(share, cost=cost)) for share in shares
        ]
        return [({"bound": "steps:4"}, FeatherPolicy(cost=cost)), *clocks]

    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shares", default="0.25,0.5")
    args = parser.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    config = {"profile": "cpu-kv-bound-fitted", "shares": shares}
    write_record(args.out, config=config, rows=sweep(_runs(shares)))


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
