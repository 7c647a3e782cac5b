"""Paged KV cache with block-level prefix caching, for the simulator.

This mirrors the semantics of vLLM V1's ``KVCacheManager`` / ``BlockPool``
(``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``) closely enough that a
scheduling policy sees the same admissions, cache hits and allocation failures,
while staying cheap enough to run every simulator step.

Model
-----
* The cache has ``num_blocks`` physical blocks of ``block_size`` tokens. Each block
  has a reference count (the number of live sequences whose block table holds it).
* A *full prompt block* that has been computed can be *registered* under its chained
  block hash (:func:`block_hashes`). A later request whose leading block hashes match
  takes a reference on the registered blocks instead of recomputing them.
* Only prompt blocks are cached. Blocks that hold decode-generated tokens (and the
  last, partial prompt block) stay private and go straight back to the plain free
  pool when released. vLLM also caches full generated blocks; the simulator does not
  need it (no multi-turn reuse of generated text inside one run), so it is left out.
* A registered block whose reference count drops to 0 is *evictable*: it stays
  cached (a hit can revive it) until an allocation needs its slot. Evictable blocks
  are kept in LRU order (``collections.OrderedDict``; head = evicted first). A
  sequence's blocks are released in reverse order, so its *last* blocks reach the
  head first and the shared leading blocks survive longest, as in vLLM.
* Allocation takes never-used / uncached free blocks first and evicts LRU cached
  blocks only when those run out. (vLLM keeps a single FIFO free queue holding both
  kinds; preferring uncached blocks keeps strictly more cache hits and never changes
  whether an allocation succeeds, because both kinds count as free.)
* Cache-hit cap: as in vLLM, at least one prompt token is always recomputed (the
  model needs the logits of the last prompt token), so at most
  ``(prompt_len - 1) // block_size`` leading blocks can hit.
* If another block is already registered under a hash when a sequence commits its
  own copy (two identical prompts prefilled concurrently), the existing block stays
  registered and the duplicate stays private (uncached).

Every mutating call either succeeds completely or raises / returns a failure value
having changed nothing. All block-sharing statistics are maintained incrementally
(O(1) per reference-count change), and the hot path of :meth:`PagedKVCache.grow`
(no block boundary crossed) is a dict lookup and two integer compares.

Invariant violations raise :class:`KVCacheInvariantError`, a subclass of
``AssertionError`` (so pytest reports it as a failed check), raised explicitly so it
is not stripped by ``python -O``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import NoReturn

import numpy as np
import xxhash

__all__ = [
    "KVCacheInvariantError",
    "PagedKVCache",
    "block_hashes",
]

_xxh3 = xxhash.xxh3_64_intdigest
# Parent digest bytes for the first block (an all-zero 64-bit "digest").
_ROOT = bytes(8)


def block_hashes(prompt: np.ndarray | Sequence[int], block_size: int = 16) -> list[int]:
    """Chained 64-bit digests of the FULL ``block_size``-token blocks of ``prompt``.

    ``digest_i = xxh3_64(digest_{i-1}.to_bytes(8, "little") + block_i_int32_le_bytes)``
    with ``digest_{-1} = 0``. Equal ``digest_i`` therefore means (up to a 2**-64
    collision chance per comparison) an equal prefix through block ``i``. A trailing
    partial block gets no digest. Tokens are hashed as little-endian int32, so the
    result is platform independent. Cost: one xxh3 call per block (~0.2 us).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    arr = np.ascontiguousarray(prompt, dtype="<i4")
    if arr.ndim != 1:
        raise ValueError(f"prompt must be 1-D, got shape {arr.shape}")
    data = arr.tobytes()
    step = 4 * block_size
    n_full = len(arr) // block_size
    out: list[int] = []
    prev = _ROOT
    for i in range(n_full):
        d = _xxh3(prev + data[i * step : (i + 1) * step])
        out.append(d)
        prev = d.to_bytes(8, "little")
    return out


class KVCacheInvariantError(AssertionError):
    """An internal consistency check of :class:`PagedKVCache` failed."""


class _Seq:
    """Per-sequence state: block table, resident token count, committed blocks."""

    __slots__ = ("blocks", "capacity", "num_committed", "num_tokens")

    def __init__(self, blocks: list[int], num_tokens: int, capacity: int, num_committed: int):
        self.blocks = blocks
        self.num_tokens = num_tokens
        self.capacity = capacity  # len(blocks) * block_size
        # Leading blocks already handled by commit (hits or registered/duplicates).
        self.num_committed = num_committed


class PagedKVCache:
    """Paged KV cache with ref-counted blocks and LRU-evicted prefix caching.

    Sequences are identified by string ids. Typical lifecycle::

        hashes = block_hashes(prompt, cache.block_size)  # once per request
        hit = cache.prefix_hit_tokens_lookup(hashes, len(prompt))  # read-only probe
        chunk = min(len(prompt) - hit, token_budget)
        if cache.allocate(rid, hashes, hit + chunk, len(prompt)) is None:
            ...  # not enough blocks: stop admitting (allocate returns the same hit)
        # ... after the step computed tokens up to n:
        cache.commit_full_blocks(rid, hashes, n)
        cache.grow(rid, n + 1)  # decode, one token per step
        cache.free(rid)  # finish or preemption
    """

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True):
        if int(num_blocks) != num_blocks or num_blocks < 1:
            raise ValueError(f"num_blocks must be an integer >= 1, got {num_blocks!r}")
        if int(block_size) != block_size or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        self.num_blocks: int = int(num_blocks)
        self.block_size: int = int(block_size)
        self.enable_prefix_caching: bool = bool(enable_prefix_caching)

        self._ref: list[int] = [0] * self.num_blocks
        self._hash: list[int | None] = [None] * self.num_blocks  # registered hash or None
        self._hash_to_block: dict[int, int] = {}
        # Uncached free blocks; pop() from the end, so lowest ids are handed out first.
        self._plain: list[int] = list(range(self.num_blocks - 1, -1, -1))
        # Unreferenced registered blocks in LRU order (first = evicted first).
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._seqs: dict[str, _Seq] = {}

        # Incremental statistics.
        self._used = 0  # blocks with refcount > 0
        self._shared_blocks = 0  # blocks with refcount >= 2
        self._shared_refs = 0  # sum of refcounts over blocks with refcount >= 2

        # Reporting counters.
        self.total_hit_tokens = 0
        self.total_queried_tokens = 0
        self.num_evictions = 0

    # ------------------------------------------------------------------ stats
    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one live sequence."""
        return self._used

    @property
    def shared_blocks(self) -> int:
        """Blocks referenced by two or more live sequences."""
        return self._shared_blocks

    @property
    def shared_refs(self) -> int:
        """Sum of reference counts over blocks with refcount >= 2."""
        return self._shared_refs

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
        return self._used / self.num_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hit tokens / queried prompt tokens over all successful allocations."""
        q = self.total_queried_tokens
        return self.total_hit_tokens / q if q else 0.0

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    def blocks_of(self, seq_id: str) -> tuple[int, ...]:
        """The sequence's block table (physical block ids, in token order)."""
        return tuple(self._get(seq_id).blocks)

    def num_tokens_of(self, seq_id: str) -> int:
        """Tokens of the sequence whose KV is resident (allocated)."""
        return self._get(seq_id).num_tokens

    def refcount(self, block_id: int) -> int:
        return self._ref[block_id]

    def block_hash_of(self, block_id: int) -> int | None:
        """The hash a block is registered under, or None if it is not cached."""
        return self._hash[block_id]

    # ----------------------------------------------------------------- lookup
    def _max_hit_blocks(self, n_hashes: int, prompt_len: int) -> int:
        if prompt_len < 1:
            return 0
        return min(n_hashes, (prompt_len - 1) // self.block_size)

    def _match(self, block_hashes: Sequence[int], prompt_len: int) -> list[int]:
        if not self.enable_prefix_caching:
            return []
        h2b = self._hash_to_block
        hits: list[int] = []
        for i in range(self._max_hit_blocks(len(block_hashes), prompt_len)):
            b = h2b.get(block_hashes[i])
            if b is None:
                break
            hits.append(b)
        return hits

    def prefix_hit_tokens_lookup(self, block_hashes: Sequence[int], prompt_len: int) -> int:
        """Read-only probe: prompt tokens that would hit the cache if allocated now.

        Applies the same cap as :meth:`allocate` (at least one token recomputed).
        Takes no references, touches no LRU order and updates no counters.
        """
        return len(self._match(block_hashes, prompt_len)) * self.block_size

    # ------------------------------------------------------------- refcounts
    def _take_free_blocks(self, n: int, out: list[int]) -> None:
        """Append ``n`` fresh blocks (refcount 1) to ``out``; the caller checked room.

        Uncached free blocks go first; then LRU cached blocks are evicted (their hash
        entries dropped).
        """
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
        self._used += n

    # -------------------------------------------------------------- mutation
    def allocate(
        self,
        seq_id: str,
        block_hashes: Sequence[int],
        num_tokens: int,
        prompt_len: int,
    ) -> int | None:
        """Admit a sequence: reuse its cached prefix and allocate the rest.

        ``block_hashes`` are the chained hashes of the prompt's full blocks
        (:func:`block_hashes`); ``prompt_len`` is the length of the token sequence to
        be computed (after a preemption by recompute, the prompt plus the tokens
        generated so far). ``num_tokens`` is the number of tokens whose KV must be
        resident after this step (the whole prompt, or cache hits plus the first
        prefill chunk); the sequence gets ``max(num_tokens, hit_tokens)`` tokens.

        Returns the number of leading prompt tokens found in the cache (a multiple of
        ``block_size``, at most ``(prompt_len - 1) // block_size`` blocks), or None
        (changing nothing) if there are not enough free blocks.
        """
        self._check_allocation(seq_id, block_hashes, num_tokens, prompt_len)
        bs = self.block_size
        hits = self._match(block_hashes, prompt_len)
        n_hit = len(hits)
        hit_tokens = n_hit * bs
        tokens = max(num_tokens, hit_tokens)
        n_new = -(-tokens // bs) - n_hit
        ref = self._ref
        # Hit blocks sitting in the evictable LRU stop being free once referenced.
        revived = 0
        for b in hits:
            if ref[b] == 0:
                revived += 1
        if n_new > len(self._plain) + len(self._evictable) - revived:
            return None

        if hits:
            self._reference(hits)
        blocks = hits
        if n_new > 0:
            self._take_free_blocks(n_new, blocks)
        self._seqs[seq_id] = _Seq(blocks, tokens, len(blocks) * bs, n_hit)
        self.total_hit_tokens += hit_tokens
        self.total_queried_tokens += prompt_len
        return hit_tokens

    def _check_allocation(
        self, seq_id: str, block_hashes: Sequence[int], num_tokens: int, prompt_len: int
    ) -> None:
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} is already allocated")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if len(block_hashes) > prompt_len // self.block_size:
            raise ValueError(
                f"{len(block_hashes)} block hashes but prompt_len={prompt_len} has only "
                f"{prompt_len // self.block_size} full blocks of {self.block_size}"
            )

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
        self._used += used
        self._shared_blocks += shared_blocks
        self._shared_refs += shared_refs

    def grow(self, seq_id: str, total_tokens: int) -> bool:
        """Extend the sequence's resident KV to ``total_tokens`` tokens.

        Allocates blocks only when a block boundary is crossed. Returns False and
        changes nothing if there are not enough free blocks. Shrinking is an error.
        """
        try:
            seq = self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"grow: unknown sequence {seq_id!r}") from None
        if total_tokens <= seq.capacity:
            if total_tokens < seq.num_tokens:
                raise ValueError(
                    f"grow: sequence {seq_id!r} has {seq.num_tokens} tokens; "
                    f"cannot shrink to {total_tokens}"
                )
            seq.num_tokens = total_tokens
            return True
        bs = self.block_size
        n_new = -(-total_tokens // bs) - len(seq.blocks)
        if n_new > len(self._plain) + len(self._evictable):
            return False
        blocks = seq.blocks
        self._take_free_blocks(n_new, blocks)
        seq.capacity = len(blocks) * bs
        seq.num_tokens = total_tokens
        return True

    def commit_full_blocks(
        self, seq_id: str, block_hashes: Sequence[int], num_computed_tokens: int
    ) -> int:
        """Register the sequence's computed full prompt blocks in the prefix cache.

        Blocks ``[already committed, min(num_computed_tokens // block_size,
        len(block_hashes)))`` are registered under their hashes, unless another block
        already holds that hash (then this copy stays private). Returns the number of
        blocks newly registered. A no-op without prefix caching.
        """
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"commit_full_blocks: unknown sequence {seq_id!r}")
        if num_computed_tokens > seq.num_tokens:
            raise ValueError(
                f"commit_full_blocks: {num_computed_tokens} computed tokens but sequence "
                f"{seq_id!r} holds only {seq.num_tokens}"
            )
        if not self.enable_prefix_caching:
            return 0
        end = min(num_computed_tokens // self.block_size, len(block_hashes))
        start = seq.num_committed
        if end <= start:
            return 0
        h2b = self._hash_to_block
        hsh = self._hash
        blocks = seq.blocks
        added = 0
        for i in range(start, end):
            h = block_hashes[i]
            if h not in h2b:
                b = blocks[i]
                h2b[h] = b
                hsh[b] = h
                added += 1
        seq.num_committed = end
        return added

    def free(self, seq_id: str) -> None:
        """Release the sequence (finished or preempted).

        Blocks whose refcount reaches 0 become evictable (LRU tail) if cached,
        else return to the uncached free pool. Blocks are released last-first, so a
        sequence's tail blocks are evicted before its leading (shared) blocks.
        """
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise KeyError(f"free: unknown sequence {seq_id!r}")
        ref = self._ref
        hsh = self._hash
        plain_append = self._plain.append
        evictable = self._evictable
        released = shared_blocks = shared_refs = 0
        for b in reversed(seq.blocks):
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
        self._used -= released
        self._shared_blocks -= shared_blocks
        self._shared_refs -= shared_refs

    # ------------------------------------------------------------- checking
    def check_invariants(self) -> None:
        """Recount everything from scratch; raise :class:`KVCacheInvariantError`.

        O(num_blocks + total block-table length): for tests and debugging, not for
        every simulator step.
        """
        self._check_tables()
        self._check_free_lists()
        self._check_hashes()
        self._check_counters()

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
        if used != self._used:
            _fail(f"num_used_blocks {self._used} != recount {used}")
        if used + self.num_free_blocks != self.num_blocks:
            _fail(f"used {used} + free {self.num_free_blocks} != num_blocks {self.num_blocks}")
        if shared != self._shared_blocks:
            _fail(f"shared_blocks {self._shared_blocks} != recount {shared}")
        if shared_refs != self._shared_refs:
            _fail(f"shared_refs {self._shared_refs} != recount {shared_refs}")

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

    def _get(self, seq_id: str) -> _Seq:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"unknown sequence {seq_id!r}")
        return seq


def _fail(msg: str) -> NoReturn:
    raise KVCacheInvariantError(msg)
