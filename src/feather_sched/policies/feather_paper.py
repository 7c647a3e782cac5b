"""`feather-paper`: the paper's contextual bandit exactly as the authors' code runs it.

Faithful to the authors' code point by point, defects included: docs/policies.md, "The
authors' policies, point by point"."""

from __future__ import annotations

import math
from collections.abc import Iterator

from feather_sched.policies.base import Policy, SchedulerView
from feather_sched.policies.paper_tree import PaperTree, paper_candidates

State = tuple[int, int, int]


def paper_state(batch: int, before: int, after: int, waiting: int) -> State:
    """`discretize_state`: the three bins of the authors' bandit."""
    return (min(batch // 4, 10), max(-5, min(5, before - after)), min(waiting // 4, 10))


class PaperBandit:
    """`ContextualBanditScheduler`: UCB1 per (state, action), pulls counted at update."""

    def __init__(self, c: float = 200.0) -> None:
        if not c >= 0:
            raise ValueError(f"c must be >= 0, got {c}")
        self.c = c
        self.pulls: dict[tuple[State, bool], int] = {}
        self.rewards: dict[tuple[State, bool], float] = {}
        self.total_steps = 0

    def score(self, state: State, action: bool) -> float:
        n = self.pulls.get((state, action), 0)
        if n == 0:
            return math.inf
        mean = self.rewards[(state, action)] / n
        return mean + self.c * math.sqrt(math.log(self.total_steps + 1) / n)

    def choose(self, state: State) -> bool:
        """ADD (True) when its score is at least STOP's."""
        return self.score(state, True) >= self.score(state, False)

    def update(self, state: State, action: bool, reward: float) -> None:
        key = (state, action)
        self.pulls[key] = self.pulls.get(key, 0) + 1
        self.rewards[key] = self.rewards.get(key, 0.0) + reward
        self.total_steps += 1


class FeatherPaperPolicy(Policy):
    name = "feather-paper"

    def __init__(self, c: float = 200.0) -> None:
        self.c = c
        self._fresh()

    def reset(self) -> None:
        """A fresh run is a fresh engine: a new queue, a new tree, an untrained bandit."""
        self._fresh()

    def _fresh(self) -> None:
        self.bandit = PaperBandit(self.c)
        self.tree = PaperTree()
        self.pending: list[tuple[State, bool]] = []
        """Decisions not yet rewarded (`_current_batch_steps`)."""
        self.last_batch = 0
        """Running count at the last recorded decision (`_last_final_batch_size`)."""
        self.last_step_time: float | None = None
        self._new_pass = False
        self.decisions = 0
        self.stops = 0

    def begin_step(self, view: SchedulerView) -> None:
        self._new_pass = True

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        return paper_candidates(self.tree, view)

    def accept(self, view: SchedulerView, request_id: str) -> bool:
        if self._new_pass:  # the first question of a new scheduler call: reward the last
            self._new_pass = False
            if self.pending and self.last_step_time is not None and self.last_step_time > 0:
                self._feedback(self.last_batch / self.last_step_time)
        batch = view.num_running
        if batch == 0:
            self.pending = []
            return True
        before, after, waiting = self.tree.features(request_id)
        state = paper_state(batch, before, after, waiting)
        add = (before == after and before > 0) or self.bandit.choose(state)
        self.pending.append((state, add))
        self.last_batch = batch
        self.decisions += 1
        self.stops += not add
        return add

    def end_step(
        self, view: SchedulerView, step_time: float, batch_size: int, prefill_tokens: int = 0
    ) -> None:
        """The time between this scheduler call and the next: the step just run."""
        self.last_step_time = step_time

    def _feedback(self, reward: float) -> None:
        for state, action in self.pending:
            self.bandit.update(state, action, reward)
        self.pending = []
