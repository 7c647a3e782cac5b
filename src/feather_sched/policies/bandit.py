"""The Feather bandit's table: ADD/STOP statistics per discrete state, UCB, and back-off.

Kept apart from the policy (`feather.py`) so that the learning rule can be read, tested and
reused on its own: the policy turns engine steps into rewards; this table turns rewards into
choices.
"""

from __future__ import annotations

import math

ADD, STOP = 0, 1


def coarse_key(key: tuple[int, ...]) -> tuple[int, int]:
    """The back-off state of a fine (batch, lost, group) bin: (group - batch, lost)."""
    batch, lost, group = key
    return (group - batch, lost)


class BanditTable:
    """Per-state ADD/STOP statistics and the UCB choice between them, with back-off.

    Rewards arrive some steps after a decision, and one scheduling pass may ask many times
    before any has arrived. So the table counts *pulls* when an action is chosen and averages
    *rewards* (raw tokens/s) when they arrive, in the fine state and in its coarse state
    (`coarse_key`). A fine state decides alone once both its actions have rewards; before
    that its coarse state decides. A coarse state with no evidence tries STOP first and, until
    an action tried there has its first reward, falls back to STOP: an ADD cannot be undone
    (the request runs to completion in the batch, mixing its prefix into every step) while a
    STOP costs a few steps of waiting at most.
    """

    def __init__(self, exploration: float = 0.05) -> None:
        self.exploration = exploration
        # key -> [pulls_add, rewards_add, mean_add, pulls_stop, rewards_stop, mean_stop];
        # fine keys are (batch, lost, group) bins, coarse keys (group - batch, lost)
        self.stats: dict[tuple[int, ...], list[float]] = {}

    def _row(self, key: tuple[int, ...]) -> list[float]:
        row = self.stats.get(key)
        if row is None:
            row = self.stats[key] = [0, 0, 0.0, 0, 0, 0.0]
        return row

    def _deciding_key(self, key: tuple[int, ...]) -> tuple[int, ...]:
        row = self.stats.get(key)
        if row is not None and row[1] and row[4]:
            return key
        return coarse_key(key)

    def choose(self, key: tuple[int, ...], scale: float) -> int:
        pulls_add, n_add, q_add, pulls_stop, n_stop, q_stop = self.stats.get(
            self._deciding_key(key), (0, 0, 0.0, 0, 0, 0.0)
        )
        if pulls_stop == 0 or n_stop == 0:
            return STOP  # keep the batch homogeneous until we know what that is worth
        if pulls_add == 0:
            return ADD
        if n_add == 0:
            return STOP  # an ADD is out; wait for its evidence before mixing again
        total = math.log(pulls_add + pulls_stop)
        scale = scale or 1.0
        ucb_add = q_add / scale + self.exploration * math.sqrt(total / n_add)
        ucb_stop = q_stop / scale + self.exploration * math.sqrt(total / n_stop)
        return ADD if ucb_add >= ucb_stop else STOP

    def greedy(self, key: tuple[int, ...]) -> int:
        _, n_add, q_add, _, n_stop, q_stop = self.stats.get(
            self._deciding_key(key), (0, 0, 0.0, 0, 0, 0.0)
        )
        return STOP if n_stop and (not n_add or q_stop > q_add) else ADD

    def pull(self, key: tuple[int, ...], action: int) -> None:
        for k in (key, coarse_key(key)):
            self._row(k)[3 * action] += 1

    def update(self, key: tuple[int, ...], action: int, reward: float) -> None:
        i = 3 * action
        for k in (key, coarse_key(key)):
            row = self._row(k)
            row[i + 1] += 1
            row[i + 2] += (reward - row[i + 2]) / row[i + 1]

    def to_dict(self) -> dict:
        return {",".join(map(str, k)): v for k, v in self.stats.items()}

    @classmethod
    def from_dict(cls, data: dict, exploration: float) -> BanditTable:
        table = cls(exploration)
        for k, v in data.items():
            try:
                key = tuple(int(x) for x in k.split(","))
            except ValueError:
                raise ValueError(f"bad bandit state key {k!r}") from None
            if len(key) not in (2, 3) or len(v) != 6:
                raise ValueError(f"bad bandit row for state {k!r}: {v!r}")
            table.stats[key] = [
                int(v[0]),
                int(v[1]),
                float(v[2]),
                int(v[3]),
                int(v[4]),
                float(v[5]),
            ]
        return table
