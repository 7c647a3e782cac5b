"""What the CHT's queries and errors name: a request's state, a proposed candidate, and the
index's misuse errors (kept apart from the tree itself, index/cht.py, which re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


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


@dataclass(frozen=True, slots=True)
class Candidate:
    """A waiting request proposed for admission, with how well it fits the running batch."""

    request_id: str
    matched_chunks: int
    """Leading chunks of its prompt already held by some running request."""
    total_chunks: int
