"""`feather-paper`: the paper's contextual bandit exactly as the authors' code runs it.

"Requests of a Feather Must Flock Together" (arXiv 2605.06046). The source is the public
reproduction sethigeet/gpu-mem-bandwidth-experiments (read at commit ec83a990b3e0), which took
it "from the supplied Feather vLLM fork":
vllm_bw/schedulers/chunked_hash_tree/contextual_bandit.py (the bandit),
vllm_bw/schedulers/policy_request_queues.py (`ChunkedHashTreeBanditRequestQueue`: when it is
asked and what it remembers), vllm_bw/policy_fork.py (`_configure_scheduler`: where vLLM asks)
and the tree (`paper_tree`). Our own implementation, point by point:

1. **Where it is asked.** vLLM calls the gate at the top of every turn of its waiting loop,
   with `current_batch_size = len(self.running)` (requests admitted this pass included). Here:
   `accept`, once per candidate, with `view.num_running`.
2. **Order.** The tree's best request: fewest chunks missing from the running set, ties to
   the first enqueued (`paper_tree`); no fallback to queue order when nothing is shared.
3. **Empty batch: ADD**, unrecorded (the queue clears its decision list and returns before
   the bandit).
4. **Shortcut: ADD when the common prefix is kept and non-empty** (`chunks_before ==
   chunks_after > 0`). Everything else, "shares nothing" included, goes to the bandit.
5. **State**: (min(batch // 4, 10), clip(chunks_before - chunks_after, -5, 5),
   min(requests_waiting // 4, 10)) in native 50-token chunks, the third feature measured at
   the kept level (0 when nothing is kept).
6. **Every decision is recorded**, shortcut ADDs included, under the same state as the
   bandit's (a kept prefix has loss 0, the same bin as "nothing shared, nothing lost").
7. **UCB**: mean reward + c * sqrt(ln(total_steps + 1) / pulls), c = 200, an untried arm
   scores infinity, ADD wins ties; `total_steps` counts every recorded update, all states.
8. **Pulls are counted at feedback, not at decision**: within a pass the same state gets the
   same answer, so the bandit keeps adding.
9. **Feedback at the next pass's first question**: the decisions of the last pass(es) are
   rewarded with (batch size at the last decision) / (time between the last two scheduler
   calls), here the latest `end_step` duration. Feedback comes before the empty-batch check,
   so a pass that starts empty still rewards the last one; nothing is rewarded while no step
   time is known (the first scheduler call).

Kept as the authors wrote it, defects included: a
preempted request is never offered again (`paper_tree`); the host's never-stall rule is the
only thing that admits it, once nothing runs.
"""

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
