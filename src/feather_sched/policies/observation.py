"""What a learned Feather policy sees, and the Feather rules with the choice left open.

`DelegatedFeather` is `FeatherPolicy` whose ADD/STOP choice comes from `choose(observation)`
(an agent in the gymnasium environment, or `feather-ppo`'s MLP), so both sit on exactly the
bandit's decision points. The observation is a float32 vector in [0, 1], one entry per name
in `FEATURES`: counts log-scaled over a fixed cap (any queue length or prompt size), prefix
lengths in tokens (any chunk size), `last_throughput` relative to the run's best decode step.
"""

from __future__ import annotations

import math
from abc import abstractmethod

import numpy as np

from feather_sched.policies.bandit import ADD, STOP
from feather_sched.policies.base import SchedulerView, is_decode_step
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.features import DecisionState
from feather_sched.policies.hold import MAX_HOLD_STEPS
from feather_sched.policies.starvation import MAX_WAIT_S

__all__ = [
    "ADD",
    "FEATURES",
    "OBS_DIM",
    "STOP",
    "DelegatedFeather",
    "ThroughputTracker",
    "observe",
]

FEATURES: tuple[str, ...] = (
    "batch",  # running sequences, vs max_num_seqs
    "lost_tokens",  # shared-prefix tokens the candidate would bring into the batch
    "group",  # waiting requests that share the candidate's prefix
    "matched_tokens",  # tokens of the candidate's prefix the batch already holds
    "joins_majority",  # 1 when at least half the batch holds the candidate's prefix
    "running_groups",  # distinct first chunks in the batch (index.num_running_roots)
    "waiting",  # waiting requests
    "last_throughput",  # last decode-dominated step's throughput / best this run
)
OBS_DIM = len(FEATURES)

_TOKENS_LOG = 17.0  # 2**17 = 131,072 tokens saturate the prefix-length features
_COUNT_LOG = 14.0  # 2**14 = 16,384 requests saturate the group and queue features


def _log_frac(value: float, log_cap: float) -> float:
    return min(1.0, math.log2(1.0 + value) / log_cap)


def observe(
    state: DecisionState, view: SchedulerView, last_throughput: float, best_throughput: float
) -> np.ndarray:
    """The observation vector for one ADD/STOP decision (see `FEATURES`)."""
    chunk = view.index.chunk_size
    seq_log = math.log2(1.0 + max(1, view.max_num_seqs))
    return np.array(
        (
            _log_frac(state.batch, seq_log),
            _log_frac(state.lost_chunks * chunk, _TOKENS_LOG),
            _log_frac(state.group, _COUNT_LOG),
            _log_frac(state.matched_chunks * chunk, _TOKENS_LOG),
            1.0 if state.joins_majority else 0.0,
            _log_frac(view.index.num_running_roots, seq_log),
            _log_frac(view.num_waiting, _COUNT_LOG),
            min(1.0, last_throughput / best_throughput) if best_throughput > 0 else 1.0,
        ),
        dtype=np.float32,
    )


class ThroughputTracker:
    """Last and best decode-dominated step throughput of a run (for `last_throughput`)."""

    __slots__ = ("best", "last")

    def __init__(self) -> None:
        self.last = 0.0
        self.best = 0.0

    def update(self, step_time: float, batch_size: int, prefill_tokens: int) -> None:
        if step_time <= 0 or not is_decode_step(batch_size, prefill_tokens):
            return  # the bandit's filter: prefill-dominated steps say little of the batch
        self.last = batch_size / step_time
        if self.last > self.best:
            self.best = self.last


def learned_decision_point(state: DecisionState) -> bool:
    """Where `feather-ppo` decides (the points its weights were trained on): every candidate
    that would dilute the batch's main prefix, joining a minority group or opening a new one.
    (The bandit asks only to open a group: `FeatherPolicy.asks`.)"""
    return state.batch > 0 and state.lost_chunks > 0


class DelegatedFeather(FeatherPolicy):
    """FeatherPolicy's decision points, with ADD/STOP answered by `choose`.

    The bandit table is never consulted or updated (`learn=False`); `decisions`, `stops` and
    `starvation_admits` count as in FeatherPolicy.
    """

    def __init__(
        self, max_wait_s: float = MAX_WAIT_S, max_hold_steps: int | None = MAX_HOLD_STEPS
    ) -> None:
        super().__init__(max_wait_s=max_wait_s, learn=False, max_hold_steps=max_hold_steps)
        self._view: SchedulerView | None = None
        self._throughput = ThroughputTracker()

    @abstractmethod
    def choose(self, observation: np.ndarray) -> int:
        """ADD (0) or STOP (1) for one decision."""

    def reset(self) -> None:
        super().reset()
        self._throughput = ThroughputTracker()

    def accept(self, view: SchedulerView, request_id: str) -> bool:
        self._view = view  # `decide` builds the observation from it
        return super().accept(view, request_id)

    def asks(self, state: DecisionState, grouped: bool = True) -> bool:
        return learned_decision_point(state)  # where it was trained to decide, in any order

    def decide(
        self, state: DecisionState, prior: tuple[float, float] | None = None, explore: bool = True
    ) -> int:
        """The learned policy's ADD/STOP (it does not explore: `explore` is not read)."""
        assert self._view is not None
        obs = observe(state, self._view, self._throughput.last, self._throughput.best)
        action = self.choose(obs)
        if action not in (ADD, STOP):
            raise ValueError(f"{type(self).__name__}.choose returned {action!r}, not ADD/STOP")
        self.decisions += 1
        if action == STOP:
            self.stops += 1
        return action

    def end_step(
        self, view: SchedulerView, step_time: float, batch_size: int, prefill_tokens: int = 0
    ) -> None:
        self._throughput.update(step_time, batch_size, prefill_tokens)

    def save(self, path):  # type: ignore[override]
        raise TypeError(f"{self.name!r} has no bandit table to save")
