"""`feather-upstream`: the fixed rule the authors proposed to vLLM (pull request #42134).

Faithful to the authors' code point by point, defects included: docs/policies.md, "The
authors' policies, point by point"."""

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
