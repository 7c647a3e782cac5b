"""`feather-paper`: the paper's bandit as published, the comparison row for our own policy.

"Requests of a Feather Must Flock Together" (arXiv 2605.06046), as described by a public
reproduction of it: a UCB bandit choosing ADD or STOP for each CHT candidate, with

- state: (min(batch // 4, 10), shared-prefix chunks of 50 tokens the candidate would lose,
  clipped to [-5, 5], min(waiting requests sharing its prefix // 4, 10));
- always ADD when the batch is empty or nothing is lost;
- reward: the batch size at the end of the scheduling pass / the time until the next
  scheduler call, credited to every decision of that pass;
- UCB1 with c = 200 on the raw reward (tokens/s), each action tried once first (ADD first).

Kept deliberately unimproved (no starvation guard, no variance, no back-off): our `feather`
policy is measured against it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from feather_sched.policies.base import Policy, SchedulerView
from feather_sched.policies.features import decision_state
from feather_sched.policies.grouped import grouped_candidates

PAPER_CHUNK_TOKENS = 50
ADD, STOP = 0, 1


class FeatherPaperPolicy(Policy):
    name = "feather-paper"

    def __init__(self, c: float = 200.0) -> None:
        if c < 0:
            raise ValueError(f"c must be >= 0, got {c}")
        self.c = c
        # state -> [pulls, rewards received, mean reward] per action
        self.stats: dict[tuple[int, int, int], list[list[float]]] = {}
        self._pending: list[tuple[tuple[int, int, int], int]] = []
        self.decisions = 0
        self.stops = 0

    def reset(self) -> None:
        self._pending = []
        self.decisions = 0
        self.stops = 0

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        return grouped_candidates(view)

    def follows_queue_order(self, view: SchedulerView) -> bool:
        return view.index.num_shared_roots == 0

    def accept(self, view: SchedulerView, request_id: str) -> bool:
        s = decision_state(view.index, request_id)
        if s.batch == 0 or s.lost_chunks == 0:
            return True
        lost = s.lost_chunks * view.index.chunk_size // PAPER_CHUNK_TOKENS
        key = (min(s.batch // 4, 10), max(-5, min(5, lost)), min(s.group // 4, 10))
        action = self._ucb(key)
        self.stats[key][action][0] += 1
        self._pending.append((key, action))
        self.decisions += 1
        self.stops += action == STOP
        return action == ADD

    def _ucb(self, key: tuple[int, int, int]) -> int:
        arms = self.stats.setdefault(key, [[0, 0, 0.0], [0, 0, 0.0]])
        for action in (ADD, STOP):
            if arms[action][0] == 0:
                return action
        total = math.log(arms[ADD][0] + arms[STOP][0])
        scores = [q + self.c * math.sqrt(total / n) for n, _, q in arms]
        return ADD if scores[ADD] >= scores[STOP] else STOP

    def end_step(
        self, view: SchedulerView, step_time: float, batch_size: int, prefill_tokens: int = 0
    ) -> None:
        if step_time <= 0 or not self._pending:
            return
        reward = batch_size / step_time
        for key, action in self._pending:
            arm = self.stats[key][action]
            arm[1] += 1
            arm[2] += (reward - arm[2]) / arm[1]
        self._pending = []
