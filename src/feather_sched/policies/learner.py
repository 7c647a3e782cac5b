"""Feather's learning: rewards for its ADD/STOP decisions, and the exploration budget.

Reward = batch size / step time, credited to a decision over a window: its own step, charged
only its marginal time (the step less what its prefill tokens cost at the best per-token rate
seen), then the `horizon` decode-dominated steps after it (prefill-heavy steps are skipped: a
prefill is a one-off cost every request pays). The own step is what a STOP gives up; the later
steps are what an ADD costs. Rewards are compared in units of the best decode-step throughput
seen, so the budget and the confidence bound mean the same on any hardware.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from feather_sched.policies.bandit import BanditTable, Choice
from feather_sched.policies.base import is_decode_step, require
from feather_sched.policies.features import DecisionState


@dataclass(slots=True)
class _Window:
    """A decision waiting for its reward: tokens and (charged) seconds seen so far."""

    key: tuple[int, ...]
    action: int
    own_step_done: bool = False
    decode_steps: int = 0
    tokens: float = 0.0
    seconds: float = 0.0


class BanditLearner:
    """The bandit table, the rewards it learns from, and the budget exploration spends.

    The conservative bandit (Wu et al., ICML 2016): the budget grows by `alpha` of each
    reward (in units of the best decode throughput seen) and each exploratory STOP spends its
    expected loss, so throughput stays within about `alpha` of always-ADD while it learns.
    `initial_budget` lets a cold run try STOP before any reward has arrived (in a burst, the
    first admission wave may be the only one)."""

    def __init__(
        self,
        alpha: float,
        confidence: float,
        initial_budget: float,
        horizon: int,
        learn: bool = True,
    ) -> None:
        require(horizon >= 1, f"horizon must be >= 1, got {horizon}")
        require(0 <= alpha < 1, f"alpha must be in [0, 1), got {alpha}")
        require(initial_budget >= 0, f"initial_budget must be >= 0, got {initial_budget}")
        self.alpha = alpha
        self.confidence = confidence
        self.initial_budget = initial_budget
        self.horizon = horizon
        self.learn = learn
        self.table = BanditTable(confidence)
        self.reward_scale = 0.0  # best decode-step tokens/s seen: the unit of gains
        self.sec_per_token = math.inf  # best step seconds per scheduled token seen
        self.history: list[tuple[int, float]] = []  # (lifetime decisions, window reward)
        self.total_decisions = 0
        self.reset()

    def reset(self) -> None:
        """A new run: what was learned stays, the run's pending windows and budget do not."""
        self.windows: list[_Window] = []
        self.budget = self.initial_budget

    def choose(
        self, state: DecisionState, prior: tuple[float, float] | None, explore: bool
    ) -> Choice:
        """The table's choice for a candidate opening a new prefix group, recorded for
        credit while learning. `explore=False`: no exploratory STOP."""
        key = state.group_bins()
        if self.learn:
            # An untried STOP keeps a batch of B from taking the candidate's waiting group
            # of G: its step throughput falls by at most G/(B+G), as a step never gets
            # faster with more sequences.
            held = max(1, state.group)
            untried = held / (state.batch + held)
            budget = self.budget if explore else -1.0  # below any cost: exploit only
            choice = self.table.choose(key, self.reward_scale, budget, untried, prior)
            if choice.exploring:
                self.budget -= choice.cost
            self.table.pull(key, choice.action)
            self.windows.append(_Window(key, choice.action))
        else:
            choice = self.table.exploit(key, self.reward_scale, prior)
        self.total_decisions += 1
        return choice

    def end_step(self, step_time: float, batch_size: int, prefill_tokens: int) -> None:
        """Credit a step to the decisions awaiting their reward; close the windows it
        completes (their rewards go to the table and grow the budget)."""
        if step_time <= 0 or batch_size <= 0:
            return
        per_token = step_time / (prefill_tokens + batch_size)
        if per_token < self.sec_per_token:
            self.sec_per_token = per_token
        decode_step = is_decode_step(batch_size, prefill_tokens)
        if decode_step:
            throughput = batch_size / step_time
            if throughput > self.reward_scale:
                self.reward_scale = throughput
        if not self.windows:
            return
        # The decision's own step, at marginal cost: what its prefill tokens would cost alone
        # is not charged (>= sec_per_token * batch_size > 0 by the update above).
        marginal = step_time - self.sec_per_token * prefill_tokens
        still_open = []
        for w in self.windows:
            if not w.own_step_done:
                w.own_step_done = True
                w.tokens += batch_size
                w.seconds += marginal
            elif decode_step:
                w.decode_steps += 1
                w.tokens += batch_size
                w.seconds += step_time
            if w.decode_steps >= self.horizon:
                reward = w.tokens / w.seconds
                self.table.update(w.key, w.action, reward)
                self.budget += self.alpha * reward / (self.reward_scale or reward)
                self.history.append((self.total_decisions, reward))
            else:
                still_open.append(w)
        self.windows = still_open

    def state(self) -> dict[str, Any]:
        """What a saved policy state holds of the learning."""
        return {
            "alpha": self.alpha,
            "confidence": self.confidence,
            "horizon": self.horizon,
            "reward_scale": self.reward_scale,
            "sec_per_token": self.sec_per_token if math.isfinite(self.sec_per_token) else None,
            "table": self.table.to_dict(),
        }

    def restore(self, payload: dict[str, Any]) -> None:
        """Take up a saved state's table and scales (`state`)."""
        self.table = BanditTable.from_dict(payload["table"], self.confidence)
        self.reward_scale = float(payload.get("reward_scale", 0.0))
        sec = payload.get("sec_per_token")
        self.sec_per_token = float(sec) if sec else math.inf
