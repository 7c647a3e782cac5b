"""What every routing rule shares: the request as a router sees it, the rule's interface, and
how ranked tiers become one replica (`pick`, as Ray Serve's router does)."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from feather_sched.index.cht import chunk_digests
from feather_sched.routing.prefix_tree import tokens_to_text

Tiers = list[list[str]]


@dataclass(eq=False)
class RoutingRequest:
    """What a router sees of a request: an id and its prompt, as token ids or as text."""

    request_id: str
    tokens: np.ndarray | None = None
    text: str | None = None
    max_tokens: int | None = None
    """The request's output cap, when it says (a forecast of its decode work)."""
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.tokens is None and self.text is None:
            raise ValueError(f"request {self.request_id!r}: needs tokens or text")

    @property
    def length(self) -> int:
        """Prompt length in the units the chain is cut in (tokens, else UTF-8 bytes)."""
        if self.tokens is not None:
            return len(self.tokens)
        return len(self.text.encode())  # type: ignore[union-attr]

    def chain(self, chunk_tokens: int, chars_per_token: int = 4) -> list[int]:
        """The prompt's chained chunk digests (the CHT's hashing): over the token ids at
        `chunk_tokens`, else over the text's UTF-8 bytes at `chunk_tokens * chars_per_token`
        bytes a chunk (a deterministic chunking of the text)."""
        key = ("chain", chunk_tokens, chars_per_token)
        if key not in self._cache:
            if self.tokens is not None:
                self._cache[key] = chunk_digests(self.tokens, chunk_tokens)
            else:
                raw = np.frombuffer(self.text.encode(), dtype=np.uint8)  # type: ignore[union-attr]
                self._cache[key] = chunk_digests(
                    raw.astype(np.int32), chunk_tokens * chars_per_token
                )
        return self._cache[key]

    def as_text(self) -> str:
        if self.text is not None:
            return self.text
        if "text" not in self._cache:
            self._cache["text"] = tokens_to_text(self.tokens)  # type: ignore[arg-type]
        return self._cache["text"]


def pick(tiers: Tiers, loads: Mapping[str, int]) -> str | None:
    """Ray's choice among ranked tiers: the first non-empty tier's shortest queue (the first
    listed on a tie). None if every tier is empty."""
    for tier in tiers:
        if tier:
            best = tier[0]
            for r in tier[1:]:
                if loads.get(r, 0) < loads.get(best, 0):
                    best = r
            return best
    return None


class RoutingRule(ABC):
    """A router's state and decision. `loads` are the replicas' queue lengths (requests
    routed there and not finished), as Ray's router caches them."""

    name: str = "rule"

    def add_replica(self, replica: str, now: float) -> None:  # noqa: B027
        """A replica joined."""

    def remove_replica(self, replica: str) -> None:  # noqa: B027
        """A replica left (scaled down or died): forget what it held."""

    @abstractmethod
    def rank(
        self,
        request: RoutingRequest,
        candidates: Sequence[str],
        loads: Mapping[str, int],
        now: float,
    ) -> Tiers:
        """Ranked tiers of candidate replicas for `request`."""

    def on_routed(self, request: RoutingRequest, replica: str, now: float) -> None:  # noqa: B027
        """`request` was sent to `replica`."""

    def on_finished(  # noqa: B027
        self, request_id: str, replica: str, now: float, output_tokens: int | None = None
    ) -> None:
        """A request routed to `replica` finished (or failed), with `output_tokens` generated
        when the framework reports it."""


def pow2_choice(rng: random.Random, candidates: Sequence[str]) -> list[str]:
    """Ray's pow2 draw: i uniform in [0, n), j uniform among the others."""
    n = len(candidates)
    if n == 0:
        return []
    if n == 1:
        return [candidates[0]]
    if n == 2:
        return list(candidates) if rng.getrandbits(1) else [candidates[1], candidates[0]]
    i = rng.randrange(n)
    j = rng.randrange(n - 1)
    if j >= i:
        j += 1
    return [candidates[i], candidates[j]]
