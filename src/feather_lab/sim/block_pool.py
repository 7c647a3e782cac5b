"""The KV cache's physical blocks: reference counts, the two free lists and the hash registry.

As vLLM V1's ``BlockPool`` (``vllm/v1/core/block_pool.py``): a block referenced by no live
sequence is free; if it is registered under a prefix hash it stays cached (a hit can revive
it) on an LRU list until an allocation needs its slot. Allocation takes uncached free blocks
first and evicts LRU cached blocks only when those run out (vLLM keeps one FIFO queue of both
kinds; preferring uncached ones keeps strictly more hits and never changes whether an
allocation succeeds). Sharing statistics are kept incrementally, O(1) per refcount change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class BlockPool:
    """Ref-counted blocks, uncached and evictable free lists, and hash -> block registry.

    `PagedKVCache` builds on it; its per-step paths read these lists directly."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks: int = int(num_blocks)
        self._ref: list[int] = [0] * self.num_blocks
        self._hash: list[int | None] = [None] * self.num_blocks  # registered hash or None
        self._hash_to_block: dict[int, int] = {}
        # Uncached free blocks; pop() from the end, so lowest ids are handed out first.
        self._plain: list[int] = list(range(self.num_blocks - 1, -1, -1))
        # Unreferenced registered blocks in LRU order (first = evicted first).
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.num_used_blocks = 0  # blocks referenced by at least one live sequence
        self.shared_blocks = 0  # blocks referenced by two or more live sequences
        self.shared_refs = 0  # sum of refcounts over blocks with refcount >= 2
        self.num_evictions = 0

    # ------------------------------------------------------------------ stats
    @property
    def num_free_blocks(self) -> int:
        """Blocks allocatable now: uncached free plus evictable cached blocks."""
        return len(self._plain) + len(self._evictable)

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks with refcount 0 (free, but still a possible cache hit)."""
        return len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered under a hash (referenced or evictable)."""
        return len(self._hash_to_block)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by live sequences (vLLM's kv usage)."""
        return self.num_used_blocks / self.num_blocks

    def refcount(self, block_id: int) -> int:
        return self._ref[block_id]

    def block_hash_of(self, block_id: int) -> int | None:
        """The hash a block is registered under, or None if it is not cached."""
        return self._hash[block_id]

    # ------------------------------------------------------------- refcounts
    def _take_free_blocks(self, n: int, out: list[int]) -> None:
        """Append ``n`` fresh blocks (refcount 1) to ``out``; the caller checked room.
        Uncached free blocks go first, then LRU cached blocks are evicted (hashes dropped)."""
        plain = self._plain
        ref = self._ref
        k = min(n, len(plain))
        if k:
            taken = plain[len(plain) - k :]
            del plain[len(plain) - k :]
            taken.reverse()  # same order as repeated pop(): lowest ids first
            for b in taken:
                ref[b] = 1
            out += taken
        if n > k:
            evictable = self._evictable
            h2b = self._hash_to_block
            hsh = self._hash
            for _ in range(n - k):
                b, _ = evictable.popitem(last=False)
                del h2b[hsh[b]]  # type: ignore[index]
                hsh[b] = None
                ref[b] = 1
                out.append(b)
            self.num_evictions += n - k
        self.num_used_blocks += n

    def _reference(self, hits: list[int]) -> None:
        """One more reader for each cached hit block: an unreferenced one leaves the
        evictable LRU and counts as used; a second reader makes a block shared."""
        ref, evictable = self._ref, self._evictable
        used = shared_blocks = shared_refs = 0
        for b in hits:
            r = ref[b]
            if r == 0:
                del evictable[b]
                used += 1
            elif r == 1:
                shared_blocks += 1
                shared_refs += 2
            else:
                shared_refs += 1
            ref[b] = r + 1
        self.num_used_blocks += used
        self.shared_blocks += shared_blocks
        self.shared_refs += shared_refs

    def _release(self, blocks: list[int]) -> None:
        """One reader fewer for each block, last block first: one left unreferenced goes to
        the evictable LRU tail if cached, else back to the uncached free list. Releasing
        last-first evicts a sequence's tail before its leading (shared) blocks, as in vLLM."""
        ref = self._ref
        hsh = self._hash
        plain_append = self._plain.append
        evictable = self._evictable
        released = shared_blocks = shared_refs = 0
        for b in reversed(blocks):
            r = ref[b]
            ref[b] = r - 1
            if r == 1:
                released += 1
                if hsh[b] is None:
                    plain_append(b)
                else:
                    evictable[b] = None
            elif r == 2:
                shared_blocks += 1
                shared_refs += 2
            else:
                shared_refs += 1
        self.num_used_blocks -= released
        self.shared_blocks -= shared_blocks
        self.shared_refs -= shared_refs

    # ---------------------------------------------------------- hash registry
    def _register(self, blocks: list[int], hashes: Sequence[int], start: int, end: int) -> int:
        """Register ``blocks[start:end]`` under ``hashes[start:end]``; a hash another block
        already holds keeps that block (this copy stays private). Returns blocks registered."""
        h2b = self._hash_to_block
        hsh = self._hash
        added = 0
        for i in range(start, end):
            h = hashes[i]
            if h not in h2b:
                b = blocks[i]
                h2b[h] = b
                hsh[b] = h
                added += 1
        return added


class SeqBlocks:
    """A sequence's block table, resident token count and committed blocks."""

    __slots__ = ("blocks", "capacity", "num_committed", "num_tokens")

    def __init__(self, blocks: list[int], num_tokens: int, capacity: int, num_committed: int):
        self.blocks = blocks
        self.num_tokens = num_tokens
        self.capacity = capacity  # len(blocks) * block_size
        # Leading blocks already handled by commit (hits or registered/duplicates).
        self.num_committed = num_committed
