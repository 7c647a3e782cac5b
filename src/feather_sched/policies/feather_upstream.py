"""`feather-upstream`: the fixed rule the authors proposed to vLLM (pull request #42134).

"[Core] Added Feather as another waiting request queue to LLM inference scheduler" (opened
2026-05-09, open when read). Its `FeatherRequestQueue` (vllm/v1/core/sched/request_queue.py)
holds no bandit: a fixed rule over the same chunked hash tree as the bandit's
(csrc/cpu/scheduler/chunked_hash_tree.cpp; `paper_tree` is our implementation of it).
Our own implementation of `should_add_more_to_batch`, point by point:

1. **Order**: the tree's best request, fewest chunks missing from the running set, ties to
   the first enqueued (with nothing running: shortest prompt first). Always reordered.
2. **Nothing waiting: STOP** (`int_id == 0`; here the candidates simply end).
3. **Empty batch: ADD**, the floor untouched.
4. **Loss** = chunks_before - chunks_after (50-token chunks of the prefix common to every
   running request that the candidate would drop). **Ceiling** 7 (`MAXIMUM_CHUNK_LOSS_LENIENT`)
   when at least 10 (`HIGH_LOAD_THRESHOLD`) waiting requests hold the kept prefix, else 5.
5. **Within the ceiling: ADD and raise the floor by one**, up to 10 (`MAX_BATCH_FLOOR`).
6. **Beyond it: ADD only while the batch is below the floor.**
7. **The floor is never reset.** It starts at 1 (`MIN_BATCH_FLOOR`) and the code only ever
   raises it; the comment "reset each scheduling round" has no code behind it in the queue
   file, so after ten homogeneous admissions it stays 10 for the life of the engine. We keep
   the code's behaviour (a fresh run, `reset`, starts again at 1).

The scheduler side of the pull request (which arguments vLLM passes, and where) is not in
what we could read; we take the call site the authors' fork uses for the bandit
(vllm_bw/policy_fork.py: the top of the waiting loop, `current_batch_size=len(self.running)`).
A preempted request is never offered again, as with the bandit (`paper_tree`).
"""

from __future__ import annotations

from collections.abc import Iterator

from feather_sched.policies.base import Policy, SchedulerView
from feather_sched.policies.paper_tree import PaperTree, paper_candidates

MAXIMUM_CHUNK_LOSS = 5
MAXIMUM_CHUNK_LOSS_LENIENT = 7
HIGH_LOAD_THRESHOLD = 10
MIN_BATCH_FLOOR = 1
MAX_BATCH_FLOOR = 10


class FeatherUpstreamPolicy(Policy):
    name = "feather-upstream"

    def __init__(self) -> None:
        self.tree = PaperTree()
        self.floor = MIN_BATCH_FLOOR
        self.decisions = 0
        self.stops = 0

    def reset(self) -> None:
        self.tree = PaperTree()
        self.floor = MIN_BATCH_FLOOR
        self.decisions = 0
        self.stops = 0

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        return paper_candidates(self.tree, view)

    def accept(self, view: SchedulerView, request_id: str) -> bool:
        batch = view.num_running
        if batch == 0:
            return True
        self.decisions += 1
        before, after, waiting = self.tree.features(request_id)
        lenient = waiting >= HIGH_LOAD_THRESHOLD
        ceiling = MAXIMUM_CHUNK_LOSS_LENIENT if lenient else MAXIMUM_CHUNK_LOSS
        if before - after <= ceiling:
            self.floor = min(self.floor + 1, MAX_BATCH_FLOOR)
            return True
        add = batch < self.floor
        self.stops += not add
        return add
