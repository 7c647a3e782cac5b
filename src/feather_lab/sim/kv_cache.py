"""Paged KV cache with block-level prefix caching, for the simulator.

Mirrors vLLM V1's ``KVCacheManager`` (``vllm/v1/core/kv_cache_manager.py``) closely enough
that a policy sees the same admissions, cache hits and allocation failures. Only full prompt
blocks are cached (vLLM also caches generated blocks; no simulated run reuses generated text);
at least one prompt token is always recomputed (the model needs its logits), so at most
``(prompt_len - 1) // block_size`` leading blocks can hit. Every mutating call succeeds
completely or raises / returns a failure value having changed nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from feather_lab.sim.block_hash import block_hashes
from feather_lab.sim.block_pool import SeqBlocks
from feather_lab.sim.kv_invariants import CheckedBlockPool, KVCacheInvariantError

__all__ = [
    "KVCacheInvariantError",
    "PagedKVCache",
    "block_hashes",
]


class PagedKVCache(CheckedBlockPool):
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
        super().__init__(num_blocks)
        self.block_size: int = int(block_size)
        self.enable_prefix_caching: bool = bool(enable_prefix_caching)
        self._seqs: dict[str, SeqBlocks] = {}
        self.total_hit_tokens = 0
        self.total_queried_tokens = 0

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

    # -------------------------------------------------------------- mutation
    def allocate(
        self,
        seq_id: str,
        block_hashes: Sequence[int],
        num_tokens: int,
        prompt_len: int,
    ) -> int | None:
        """Admit a sequence: reuse its cached prefix and allocate the rest.

        ``block_hashes`` are the chained hashes of the prompt's full blocks;
        ``prompt_len`` is the length of the token sequence to be computed (after a
        preemption by recompute, the prompt plus the tokens generated so far).
        ``num_tokens`` is the tokens whose KV must be resident after this step (the whole
        prompt, or cache hits plus the first prefill chunk); the sequence gets
        ``max(num_tokens, hit_tokens)`` tokens.

        Returns the leading prompt tokens found in the cache (whole blocks, within the hit
        cap), or None (changing nothing) if there are not enough free blocks.
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
        self._seqs[seq_id] = SeqBlocks(blocks, tokens, len(blocks) * bs, n_hit)
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

    def grow(self, seq_id: str, total_tokens: int) -> bool:
        """Extend the sequence's resident KV to ``total_tokens`` tokens.

        Allocates blocks only when a block boundary is crossed (the per-token path is a
        dict lookup and two compares). Returns False and changes nothing if there are not
        enough free blocks. Shrinking is an error.
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
        already holds that hash (two identical prompts prefilled together: this copy stays
        private). Returns the blocks newly registered. A no-op without prefix caching.
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
        added = self._register(seq.blocks, block_hashes, start, end)
        seq.num_committed = end
        return added

    def free(self, seq_id: str) -> None:
        """Release the sequence (finished or preempted); its cached blocks stay evictable."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise KeyError(f"free: unknown sequence {seq_id!r}")
        self._release(seq.blocks)

    def _get(self, seq_id: str) -> SeqBlocks:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"unknown sequence {seq_id!r}")
        return seq
