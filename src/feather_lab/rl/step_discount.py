"""Discount per engine step, not per decision: PPO's returns on Feather's clock.

Feather's decisions are not evenly spaced in time: one admission pass may ask hundreds (an
ADD is followed at once by the next candidate), while a STOP waits a whole engine step for
the next. With sb3's per-decision discount, every ADD then pushes all later rewards one
discount factor further away for free; with this env's rewards (all <= 0) that alone makes
ADD look better, and PPO learned ADD everywhere (the bench long-prefix at 4,102 tok/s, the
bandit at 8,983). Here a transition's discount is `gamma ** k` (and GAE's `lambda ** k`),
k = the engine steps between the decision and the next one (`info["engine_steps"]`): the
decisions of one pass share their outcome undiscounted, and `gamma` means "per engine step".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from stable_baselines3.common.buffers import RolloutBuffer


class StepDiscountBuffer(RolloutBuffer):
    """RolloutBuffer whose GAE discounts each transition by the engine steps it spans."""

    def reset(self) -> None:
        super().reset()
        self.gaps = np.ones((self.buffer_size, self.n_envs), dtype=np.float32)
        self._next_gaps = np.ones(self.n_envs, dtype=np.float32)

    def set_next_gaps(self, infos: Sequence[dict]) -> None:
        """Engine steps of the transitions about to be added (from the env step's infos)."""
        self._next_gaps = np.array([i.get("engine_steps", 1) for i in infos], dtype=np.float32)

    def add(self, *args, **kwargs) -> None:
        self.gaps[self.pos] = self._next_gaps
        super().add(*args, **kwargs)

    def compute_returns_and_advantage(self, last_values, dones: np.ndarray) -> None:
        last_values = last_values.clone().cpu().numpy().flatten()
        last_gae = np.zeros(self.n_envs, dtype=np.float32)
        for step in reversed(range(self.buffer_size)):
            if step == self.buffer_size - 1:
                next_non_terminal = 1.0 - dones.astype(np.float32)
                next_values = last_values
            else:
                next_non_terminal = 1.0 - self.episode_starts[step + 1]
                next_values = self.values[step + 1]
            gamma = self.gamma ** self.gaps[step]
            delta = self.rewards[step] + gamma * next_values * next_non_terminal - self.values[step]
            lam = self.gae_lambda ** self.gaps[step]
            last_gae = delta + gamma * lam * next_non_terminal * last_gae
            self.advantages[step] = last_gae
        self.returns = self.advantages + self.values
