"""`feather bench --steps-out FILE.jsonl`: what the scheduler decided, one line per step.

`StepRecorder` wraps any policy (it is a `Policy` itself, so any host runs it unchanged:
the simulator, or an engine adapter) and writes, for every step the host reports back
(`end_step`): the simulated (or wall) time, the step's duration, batch size, prefill tokens,
running prefix groups, waiting queue length, the ids admitted this step, and each ADD/STOP
the policy answered with the candidate's features (`policies.features.DecisionState`: batch
size, prefix chunks it would lose, its waiting group size, chunks already running, depth of
its shared prefix) and, for Feather, whether it was a real decision (`asked`: the candidate
opens a new prefix group), an exploration, a KV-gate refusal (`kv_refused`), and the cost
model's predicted gain of STOP.

Lines are JSON objects with `workload` and `policy` first, so one file holds a whole bench.
Admissions the host forces past a STOP (never-stall) are not the policy's and do not show as
decisions; their ids do show in `admitted`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

from feather_sched.policies.base import Policy, SchedulerView

__all__ = ["StepRecorder"]


class StepRecorder(Policy):
    """A policy that delegates everything to `inner` and logs each step to `out`."""

    def __init__(self, inner: Policy, out: IO[str], labels: dict[str, Any]) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]  # the row keeps the inner policy's name
        self._out = out
        self._labels = labels
        self._decisions: list[dict[str, Any]] = []
        self._candidates: list[str] = []
        self._step = 0

    def __getattr__(self, attr: str) -> Any:  # counters (decisions, stops, ...) and options
        return getattr(self.inner, attr)

    def begin_step(self, view: SchedulerView) -> None:
        self.inner.begin_step(view)

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        for rid in self.inner.candidates(view):
            self._candidates.append(rid)
            yield rid

    def follows_queue_order(self, view: SchedulerView) -> bool:
        return self.inner.follows_queue_order(view)

    def accept(self, view: SchedulerView, request_id: str) -> bool:
        entry = {"id": request_id, **self._features(view, request_id)}
        counters = ("decisions", "explorations", "kv_refusals")
        before = [_count(self.inner, c) for c in counters]
        add = self.inner.accept(view, request_id)
        after = [_count(self.inner, c) for c in counters]
        entry["action"] = "ADD" if add else "STOP"
        if before[0] is not None:
            entry["asked"] = after[0] != before[0]
        if before[1] is not None and after[1] != before[1]:
            entry["explored"] = True
        if before[2] is not None and after[2] != before[2]:
            entry["kv_refused"] = True  # the KV gate: it would not fit the engine's blocks
        self._decisions.append(entry)
        return add

    def _features(self, view: SchedulerView, request_id: str) -> dict[str, Any]:
        from feather_sched.policies.features import decision_state

        try:
            state = decision_state(view.index, request_id)
        except Exception:  # a host without the CHT's bookkeeping: no features
            return {}
        feats: dict[str, Any] = dict(state._asdict())
        prior = getattr(self.inner, "prior", None)
        if callable(prior) and getattr(self.inner, "cost", None) is not None:
            try:
                gain = prior(view, state, request_id)
            except Exception:
                gain = None
            if gain is not None:
                feats["prior_stop_gain"] = round(float(gain[0]), 5)
        return feats

    def end_step(
        self, view: SchedulerView, step_time: float, batch_size: int, prefill_tokens: int = 0
    ) -> None:
        self.inner.end_step(view, step_time, batch_size, prefill_tokens)
        self._step += 1
        waiting = set(view.waiting_ids()) if self._candidates else set()
        admitted = [rid for rid in dict.fromkeys(self._candidates) if rid not in waiting]
        index = view.index
        line = {
            **self._labels,
            "step": self._step,
            "time_s": round(float(view.now), 6),
            "duration_s": round(float(step_time), 6),
            "batch": batch_size,
            "prefill_tokens": prefill_tokens,
            "prefix_groups": int(getattr(index, "num_running_roots", 0)),
            "waiting": view.num_waiting,
            "admitted": admitted,
            "decisions": self._decisions,
        }
        self._out.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._decisions = []
        self._candidates = []

    def reset(self) -> None:
        self.inner.reset()
        self._decisions, self._candidates, self._step = [], [], 0


def _count(policy: Policy, attr: str) -> int | None:
    value = getattr(policy, attr, None)
    return value if isinstance(value, int) else None
