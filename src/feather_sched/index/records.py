"""What the CHT's queries and errors name: a request's state, a proposed candidate, the
index's misuse errors, and the queue sizes of a holder of waiting and running requests (kept
apart from the tree itself, index/cht.py, which re-exports them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class CHTError(LookupError):
    """Base class for index misuse (unknown ids, duplicates, wrong transitions)."""


class UnknownRequestError(CHTError, KeyError):
    """The id is not in the index."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown request"


class DuplicateRequestError(CHTError, ValueError):
    """The id is already in the index."""


class InvalidTransitionError(CHTError, ValueError):
    """The request is not in the state the operation needs (e.g. admitting a running one)."""


class RequestState(Enum):
    WAITING = "waiting"
    RUNNING = "running"


class QueueSizes:
    """`num_waiting` and `num_running` of a holder that keeps its waiting and its running
    requests in two maps by id (the CHT, the simulator's view): the two counts every
    `SchedulerView` offers, defined once for the holders that count their own maps."""

    _waiting: Mapping[str, Any]
    _running: Mapping[str, Any]

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A waiting request proposed for admission, with how well it fits the running batch."""

    request_id: str
    matched_chunks: int
    """Leading chunks of its prompt already held by some running request."""
    total_chunks: int
