"""The KV cache's self-check: recount every block and sequence from scratch.

Violations raise :class:`KVCacheInvariantError`, an ``AssertionError`` (pytest reports a
failed check) raised explicitly so ``python -O`` does not strip it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from feather_lab.sim.block_pool import BlockPool

if TYPE_CHECKING:
    from feather_lab.sim.block_pool import SeqBlocks


class KVCacheInvariantError(AssertionError):
    """An internal consistency check of :class:`PagedKVCache` failed."""


def _fail(msg: str) -> NoReturn:
    raise KVCacheInvariantError(msg)


class CheckedBlockPool(BlockPool):
    """A block pool holding sequences' block tables, with the full recount of its books.

    O(num_blocks + total block-table length): for tests, the end of a run and
    `EngineConfig.check_invariants_every`, not every step."""

    block_size: int
    enable_prefix_caching: bool
    _seqs: dict[str, SeqBlocks]

    def check_invariants(self) -> None:
        """Recount everything; raise :class:`KVCacheInvariantError` on a mismatch."""
        self._check_tables()
        self._check_free_lists()
        self._check_hashes()
        self._check_counters()

    def assert_empty(self) -> None:
        """Check that no sequence or reference is left and no block leaked."""
        if self._seqs:
            raise KVCacheInvariantError(
                f"{len(self._seqs)} sequences still allocated: {list(self._seqs)[:10]}"
            )
        self.check_invariants()
        if self.num_free_blocks != self.num_blocks:
            raise KVCacheInvariantError(
                f"leak: {self.num_free_blocks} free of {self.num_blocks} blocks"
            )
        if len(self._evictable) != len(self._hash_to_block):
            raise KVCacheInvariantError(
                f"{len(self._hash_to_block)} cached blocks but {len(self._evictable)} evictable"
            )

    def _check_tables(self) -> None:
        """Block tables: in range, no block twice, capacity and token counts consistent,
        and every refcount equal to the number of sequences holding the block."""
        n = self.num_blocks
        expected = [0] * n
        for sid, seq in self._seqs.items():
            seen: set[int] = set()
            for b in seq.blocks:
                if not 0 <= b < n:
                    _fail(f"sequence {sid!r} holds out-of-range block {b}")
                if b in seen:
                    _fail(f"sequence {sid!r} holds block {b} twice")
                seen.add(b)
                expected[b] += 1
            if seq.capacity != len(seq.blocks) * self.block_size:
                _fail(f"sequence {sid!r}: capacity {seq.capacity} != blocks*block_size")
            if not (seq.capacity - self.block_size < seq.num_tokens <= seq.capacity) and not (
                seq.num_tokens == 0 and not seq.blocks
            ):
                _fail(
                    f"sequence {sid!r}: {seq.num_tokens} tokens in {len(seq.blocks)} blocks "
                    f"of {self.block_size}"
                )
            if not 0 <= seq.num_committed <= len(seq.blocks):
                _fail(f"sequence {sid!r}: num_committed {seq.num_committed} out of range")
        for b in range(n):
            r = self._ref[b]
            if r < 0:
                _fail(f"block {b} has negative refcount {r}")
            if r != expected[b]:
                _fail(f"block {b}: refcount {r} but held by {expected[b]} sequences")

    def _check_free_lists(self) -> None:
        """Free blocks: unreferenced, on one list only, hashed exactly when evictable."""
        plain = set(self._plain)
        if len(plain) != len(self._plain):
            _fail("uncached free list contains duplicates")
        evict = set(self._evictable)
        if plain & evict:
            _fail(f"blocks both uncached-free and evictable: {sorted(plain & evict)[:10]}")
        for b in plain:
            if self._ref[b]:
                _fail(f"block {b} is free but has refcount {self._ref[b]}")
            if self._hash[b] is not None:
                _fail(f"block {b} is in the uncached free list but carries a hash")
        for b in evict:
            if self._ref[b]:
                _fail(f"block {b} is evictable but has refcount {self._ref[b]}")
            if self._hash[b] is None:
                _fail(f"block {b} is evictable but carries no hash")

    def _check_hashes(self) -> None:
        """The hash map and the blocks' hashes agree, and are empty without prefix caching."""
        for h, b in self._hash_to_block.items():
            if self._hash[b] != h:
                _fail(f"hash map: {h:#x} -> block {b}, whose hash is {self._hash[b]!r}")
        n_hashed = sum(1 for h in self._hash if h is not None)
        if n_hashed != len(self._hash_to_block):
            _fail(f"{n_hashed} blocks carry a hash but the hash map has {len(self._hash_to_block)}")
        if not self.enable_prefix_caching and self._hash_to_block:
            _fail("prefix caching disabled but blocks are registered")

    def _check_counters(self) -> None:
        """The incremental counters equal a recount of the refcounts."""
        used = sum(1 for r in self._ref if r > 0)
        shared = sum(1 for r in self._ref if r >= 2)
        shared_refs = sum(r for r in self._ref if r >= 2)
        if used != self.num_used_blocks:
            _fail(f"num_used_blocks {self.num_used_blocks} != recount {used}")
        if used + self.num_free_blocks != self.num_blocks:
            _fail(f"used {used} + free {self.num_free_blocks} != num_blocks {self.num_blocks}")
        if shared != self.shared_blocks:
            _fail(f"shared_blocks {self.shared_blocks} != recount {shared}")
        if shared_refs != self.shared_refs:
            _fail(f"shared_refs {self.shared_refs} != recount {shared_refs}")
