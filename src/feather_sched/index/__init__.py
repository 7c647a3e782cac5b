"""Prefix indexes: the Chunked Hash Tree (for schedulers) and a token radix tree (reference)."""

from feather_sched.index.cht import (
    Candidate,
    ChunkedHashTree,
    DuplicateRequestError,
    InvalidTransitionError,
    RequestState,
    UnknownRequestError,
    chunk_digests,
)
from feather_sched.index.radix import RadixTree

__all__ = [
    "Candidate",
    "ChunkedHashTree",
    "DuplicateRequestError",
    "InvalidTransitionError",
    "RadixTree",
    "RequestState",
    "UnknownRequestError",
    "chunk_digests",
]
