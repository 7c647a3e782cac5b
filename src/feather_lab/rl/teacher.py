"""Demonstrations from the Feather bandit, to warm-start PPO's actor.

From a random or STOP-leaning start, PPO on FeatherEnv drifts to one action everywhere: what
a decision is worth shows only when the same choice is repeated for many steps (a homogeneous
batch needs STOP at every step while a group runs; opening a group pays only when its members
are all ADDed in one pass), and per-decision random exploration never repeats a choice long
enough. Measured on the training mix: all-ADD from a 50/50 start, all-STOP from a STOP-leaning
one, either way far below the bandit. So the actor first imitates the bandit's greedy choices
(learned online over a few runs of each mix workload, recorded as this package's
observations), and PPO then improves on that policy from where consistent choices are made.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.workloads.base import Workload
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.base import SchedulerView
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.features import DecisionState
from feather_sched.policies.observation import (
    OBS_DIM,
    ThroughputTracker,
    learned_decision_point,
    observe,
)

__all__ = ["RecordingFeather", "collect_demonstrations"]


class RecordingFeather(FeatherPolicy):
    """The bandit, unchanged, recording (observation, action) at each decision it makes."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.recording = False
        self.observations: list[np.ndarray] = []
        self.actions: list[int] = []
        self._view: SchedulerView | None = None
        self._throughput = ThroughputTracker()

    def reset(self) -> None:
        super().reset()
        self._throughput = ThroughputTracker()

    def accept(self, view: SchedulerView, request_id: str) -> bool:
        self._view = view
        return super().accept(view, request_id)

    def asks(self, state: DecisionState, grouped: bool = True) -> bool:
        return learned_decision_point(state)  # record where the learned policy will decide

    def decide(
        self, state: DecisionState, prior: tuple[float, float] | None = None, explore: bool = True
    ) -> int:
        action = super().decide(state, prior, explore)
        if self.recording:
            assert self._view is not None
            t = self._throughput
            self.observations.append(observe(state, self._view, t.last, t.best))
            self.actions.append(action)
        return action

    def end_step(
        self, view: SchedulerView, step_time: float, batch_size: int, prefill_tokens: int = 0
    ) -> None:
        super().end_step(view, step_time, batch_size, prefill_tokens)
        self._throughput.update(step_time, batch_size, prefill_tokens)


def collect_demonstrations(
    entries: Sequence[tuple[Workload, EngineConfig]],
    cost: StepCostModel,
    learn_runs: int = 2,
    record_runs: int = 1,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Per workload: a fresh bandit learns over `learn_runs` runs, then its greedy choices
    are recorded over `record_runs` more. Returns (observations, actions)."""
    observations: list[np.ndarray] = []
    actions: list[int] = []
    for i, (workload, engine) in enumerate(entries):
        policy = RecordingFeather()
        for run in range(learn_runs + record_runs):
            recording = run >= learn_runs
            policy.learn = not recording
            policy.recording = recording
            simulate(workload.generate(seed * 10_000 + i * 100 + run), policy, cost, engine)
        observations.extend(policy.observations)
        actions.extend(policy.actions)
    if not observations:
        return np.zeros((0, OBS_DIM), dtype=np.float32), np.zeros(0, dtype=np.int64)
    return np.stack(observations), np.array(actions, dtype=np.int64)
