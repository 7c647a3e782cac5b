"""`OrderedRequestQueue` behaves as vLLM's own `FCFSRequestQueue` under any operation sequence.

The Feather scheduler stands it in for vLLM's FCFS deque (vllm/queue.py), so
every operation vLLM's scheduler uses must leave both in the same order, with the same result
and the same errors. A hypothesis state machine drives both with real vLLM requests.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from requires import require

pytestmark = pytest.mark.vllm

require("vllm", "vllm", "needs the real vLLM engine: pip install -e '.[vllm]' (see pyproject)")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.core.sched.request_queue import FCFSRequestQueue  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from feather_sched.vllm.queue import OrderedRequestQueue  # noqa: E402


def _request(i: int) -> Request:
    return Request(f"r{i}", [4, 5, 6], SamplingParams(max_tokens=1), None)


class SameAsVllmsQueue(RuleBasedStateMachine):
    """Both queues get the same operations; requests are added only once at a time (vLLM
    never queues a request twice), removed ones may come back (skipped, preempted)."""

    def __init__(self) -> None:
        super().__init__()
        self.vllm = FCFSRequestQueue()
        self.ours = OrderedRequestQueue()
        self.pool = [_request(i) for i in range(12)]

    def _outside(self) -> list[Request]:
        return [r for r in self.pool if r not in set(self.vllm)]

    @precondition(lambda self: self._outside())
    @rule(data=st.data(), front=st.booleans())
    def add(self, data, front: bool) -> None:
        req = data.draw(st.sampled_from(self._outside()))
        for q in (self.vllm, self.ours):
            (q.prepend_request if front else q.add_request)(req)

    @precondition(lambda self: self._outside())
    @rule(data=st.data())
    def prepend_many(self, data) -> None:
        outside = self._outside()
        reqs = data.draw(st.lists(st.sampled_from(outside), unique=True, max_size=len(outside)))
        for q in (self.vllm, self.ours):
            q.prepend_requests(list(reqs))

    @rule()
    def pop_or_peek(self) -> None:
        for op in ("peek_request", "pop_request"):
            results = []
            for q in (self.vllm, self.ours):
                try:
                    results.append(getattr(q, op)())
                except IndexError:
                    results.append(IndexError)
            assert results[0] is results[1]

    @rule(data=st.data())
    def remove_one(self, data) -> None:
        req = data.draw(st.sampled_from(self.pool))
        errors = []
        for q in (self.vllm, self.ours):
            try:
                q.remove_request(req)
                errors.append(None)
            except ValueError:
                errors.append(ValueError)
        assert errors[0] is errors[1]

    @rule(data=st.data())
    def remove_many(self, data) -> None:
        reqs = data.draw(st.lists(st.sampled_from(self.pool), max_size=6))
        for q in (self.vllm, self.ours):
            q.remove_requests(reqs)

    @invariant()
    def same_order(self) -> None:
        assert list(self.ours) == list(self.vllm)
        assert len(self.ours) == len(self.vllm)
        assert bool(self.ours) == bool(self.vllm)


SameAsVllmsQueue.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
test_same_as_vllms_queue = SameAsVllmsQueue.TestCase
