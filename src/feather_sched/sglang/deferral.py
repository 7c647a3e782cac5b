"""Which waiting requests a pass skips because their prefix is in flight, and the KV they keep.

SGLang inserts a prefix into its radix tree once it is computed, so one prefill batch computes
a shared prefix once per member (vLLM caches a block when it allocates it, so its batch shares
it). A request sharing at least a chunk with one admitted earlier in the pass (or still
prefilling chunk by chunk) waits a pass and finds the prefix cached, as SGLang's own
cache-aware policies defer such requests. Once a pass defers, it admits a request only if the
KV left after it still covers what the skipped groups take next pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from feather_sched.index.cht import ChunkedHashTree
from feather_sched.sglang.fields import kv_need


class InFlightPrefixes:
    """The in-flight prefixes one pass skips the waiting members of, and their KV reserve."""

    __slots__ = ("_block_size", "_index", "deferred", "radix_on", "reserved")

    def __init__(self, index: ChunkedHashTree, block_size: int) -> None:
        self._index = index
        self._block_size = block_size
        self.radix_on = False
        """SGLang's radix cache is on (read at each pass's start)."""
        self.deferred: set[int] = set()
        """The in-flight prefixes (CHT keys) whose waiting members this pass skips."""
        self.reserved = 0
        """KV tokens those members will take next pass."""

    def begin(self, tree_cache: Any) -> None:
        """A new pass: nothing deferred; no radix cache as SGLang tests it (`disable` absent
        counting as off)."""
        self.radix_on = not getattr(tree_cache, "disable", True)
        self.deferred = set()
        self.reserved = 0

    def in_flight(self, req: Any) -> bool:
        """Whether `req` shares at least a chunk with a running request that SGLang's radix
        cache does not hold yet. Read off `req.prefix_len`, the radix match SGLang made just
        before offering it (`Req.init_next_round_input`), which never covers a prompt's last
        token."""
        cached = getattr(req, "prefix_len", None)
        if cached is None or not self.radix_on:
            return False
        index, page = self._index, self._block_size
        matchable = (len(req.origin_input_ids) - 1) // page * page
        shared = min(index.matched_chunks(req.rid) * index.chunk_size, matchable)
        return shared - int(cached) >= index.chunk_size

    def reserve(self, req: Any, max_num_seqs: int) -> None:
        """Count once the KV the waiting members of `req`'s in-flight prefix need next pass:
        each its part past the prefix and its output, up to the free request slots."""
        index = self._index
        matched = index.matched_chunks(req.rid)
        key = index.keys_of(req.rid)[matched - 1]
        if key in self.deferred:
            return
        self.deferred.add(key)
        slots = max(1, max_num_seqs - index.num_running)
        members = min(index.group_size(req.rid, matched), slots)
        self.reserved += members * kv_need(req, matched * index.chunk_size)

    def leaves_reserve(self, req: Any, room: Callable[[], float] | None) -> bool:
        """Whether admitting `req` leaves the reserve free: `room` reads the KV tokens the
        adder has left (None: unknown, taken as enough)."""
        cached = int(getattr(req, "prefix_len", 0) or 0)
        return room is None or room() - kv_need(req, cached) >= self.reserved
