"""vLLM's first-come-first-served waiting queue with O(1) removal of any request.

vLLM's `FCFSRequestQueue` (vllm/v1/core/sched/request_queue.py) is a deque: its own loop only
ever takes the head, and `remove_request` of any other request scans the deque. Feather takes
its candidates from anywhere in the queue, one `remove_request` per admission, so on that
deque every admission costs a scan of the queue (~0.1 ms at 1,000 waiting, ~1 ms at 10,000:
benchmarks/vllm/pass.md). `OrderedRequestQueue` keeps the same order under the same
operations in an `OrderedDict` keyed by the request object (a linked hash map: append,
prepend, remove anywhere and pop the head are all O(1)), so the Feather scheduler can stand
it in for vLLM's FCFS queue without changing what vLLM sees. tests/test_vllm_queue.py runs
random operation sequences on both and compares them after every step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

__all__ = ["OrderedRequestQueue"]


class OrderedRequestQueue(RequestQueue):
    """`FCFSRequestQueue`'s behaviour (the same order after every operation, the same errors
    on an empty queue or a missing request) on an `OrderedDict`. A request is in the queue
    at most once (vLLM never queues one twice)."""

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._order: OrderedDict[Request, None] = OrderedDict.fromkeys(requests)

    def add_request(self, request: Request) -> None:
        self._order[request] = None

    def pop_request(self) -> Request:
        if not self._order:
            raise IndexError("pop from an empty queue")
        return self._order.popitem(last=False)[0]

    def peek_request(self) -> Request:
        if not self._order:
            raise IndexError("peek from an empty queue")
        return next(iter(self._order))

    def prepend_request(self, request: Request) -> None:
        self._order[request] = None
        self._order.move_to_end(request, last=False)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        """Each to the front in turn, so they end up in reverse order (`deque.extendleft`,
        as vLLM's queue does)."""
        for request in requests:
            self.prepend_request(request)

    def remove_request(self, request: Request) -> None:
        try:
            del self._order[request]
        except KeyError:
            raise ValueError(f"request {request.request_id!r} is not in the queue") from None

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Those present; the others are ignored (as vLLM's queue filters)."""
        for request in requests:
            self._order.pop(request, None)

    def __bool__(self) -> bool:
        return bool(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._order)
