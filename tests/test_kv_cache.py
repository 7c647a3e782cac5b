"""Tests for the simulator's paged KV cache with block-level prefix caching."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    rule,
)

from feather_lab.sim.kv_cache import KVCacheInvariantError, PagedKVCache, block_hashes

BS = 16


def _toks(*parts: np.ndarray | list[int]) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype=np.int32) for p in parts])


def _rand(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 32000, size=n, dtype=np.int32)


def _admit(cache: PagedKVCache, sid: str, prompt: np.ndarray, num_tokens: int | None = None):
    """Allocate the whole prompt (or num_tokens), then commit what was computed."""
    hs = block_hashes(prompt, cache.block_size)
    n = len(prompt) if num_tokens is None else num_tokens
    hit = cache.allocate(sid, hs, n, len(prompt))
    if hit is not None:
        cache.commit_full_blocks(sid, hs, cache.num_tokens_of(sid))
    return hit


def _snapshot(cache: PagedKVCache):
    return (
        list(cache._ref),
        list(cache._hash),
        dict(cache._hash_to_block),
        list(cache._plain),
        list(cache._evictable),
        {
            k: (list(s.blocks), s.num_tokens, s.capacity, s.num_committed)
            for k, s in cache._seqs.items()
        },
        (cache.num_used_blocks, cache.shared_blocks, cache.shared_refs),
        (cache.total_hit_tokens, cache.total_queried_tokens, cache.num_evictions),
    )


# --------------------------------------------------------------------- hashes
def test_block_hashes_chain_and_full_blocks_only():
    shared = _rand(3 * BS, 1)
    a = _toks(shared, _rand(2 * BS + 5, 2))
    b = _toks(shared, _rand(2 * BS + 5, 3))
    ha, hb = block_hashes(a, BS), block_hashes(b, BS)
    assert len(ha) == len(a) // BS == 5
    assert ha[:3] == hb[:3]
    assert all(x != y for x, y in zip(ha[3:], hb[3:], strict=True))
    # The trailing partial block does not matter.
    assert block_hashes(a[: 5 * BS], BS) == ha
    assert block_hashes(a[: BS - 1], BS) == []
    # Chained: the same block content after a different prefix hashes differently.
    blk = _rand(BS, 4)
    assert (
        block_hashes(_toks(_rand(BS, 5), blk), BS)[1]
        != block_hashes(_toks(_rand(BS, 6), blk), BS)[1]
    )
    # Lists, int64 arrays and int32 arrays agree; all digests are 64-bit ints.
    assert block_hashes(a.tolist(), BS) == block_hashes(a.astype(np.int64), BS) == ha
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in ha)
    with pytest.raises(ValueError):
        block_hashes(a, 0)
    with pytest.raises(ValueError):
        block_hashes(a.reshape(-1, 1), BS)


# --------------------------------------------------------------- prefix hits
def test_prefix_hit_three_shared_blocks():
    cache = PagedKVCache(64, BS)
    shared = _rand(3 * BS, 1)
    a, b = _toks(shared, _rand(40, 2)), _toks(shared, _rand(40, 3))
    assert _admit(cache, "a", a) == 0
    assert cache.prefix_hit_tokens_lookup(block_hashes(b, BS), len(b)) == 48
    assert _admit(cache, "b", b) == 48
    assert cache.blocks_of("b")[:3] == cache.blocks_of("a")[:3]
    assert cache.blocks_of("b")[3:] != cache.blocks_of("a")[3:]
    assert cache.total_hit_tokens == 48
    assert cache.total_queried_tokens == len(a) + len(b)
    assert cache.prefix_cache_hit_rate == pytest.approx(48 / (len(a) + len(b)))
    cache.check_invariants()
    # Still a hit after both finished (blocks are evictable, not gone).
    cache.free("a")
    cache.free("b")
    assert cache.num_used_blocks == 0
    assert _admit(cache, "c", b) == 5 * BS  # 88 tokens: 5 full blocks, cap (88-1)//16 = 5
    cache.free("c")
    cache.assert_empty()


@pytest.mark.parametrize(("length", "expected"), [(64, 48), (65, 64), (63, 48), (16, 0), (17, 16)])
def test_identical_prompt_hit_is_capped(length, expected):
    cache = PagedKVCache(32, BS)
    p = _rand(length, 7)
    assert _admit(cache, "a", p) == 0
    cache.free("a")
    assert _admit(cache, "b", p) == expected
    assert expected < length
    assert cache.num_tokens_of("b") == length
    cache.free("b")
    cache.assert_empty()


def test_chunked_prefill_commits_progressively():
    cache = PagedKVCache(32, BS)
    p = _rand(100, 8)
    hs = block_hashes(p, BS)
    assert cache.allocate("a", hs, 40, len(p)) == 0  # first chunk of 40 tokens
    assert len(cache.blocks_of("a")) == 3
    assert cache.commit_full_blocks("a", hs, 40) == 2  # blocks 0, 1 are full
    assert cache.prefix_hit_tokens_lookup(hs, len(p)) == 32
    assert cache.grow("a", 80)
    assert cache.commit_full_blocks("a", hs, 80) == 3
    assert cache.commit_full_blocks("a", hs, 80) == 0  # idempotent
    assert cache.grow("a", 100)
    assert cache.commit_full_blocks("a", hs, 100) == 1  # 6 full blocks, partial 7th not cached
    assert cache.num_cached_blocks == 6
    # Decode: generated blocks are never cached.
    for t in range(101, 140):
        assert cache.grow("a", t)
    cache.commit_full_blocks("a", hs, 139)
    assert cache.num_cached_blocks == 6
    with pytest.raises(ValueError, match="computed tokens"):
        cache.commit_full_blocks("a", hs, 200)
    cache.free("a")
    assert cache.num_evictable_blocks == 6
    cache.assert_empty()


def test_hit_with_num_tokens_below_hits_and_preemption_recompute():
    cache = PagedKVCache(32, BS)
    p = _rand(80, 9)
    _admit(cache, "a", p)
    cache.free("a")
    hs = block_hashes(p, BS)
    # The simulator may ask for 0 new tokens: the hit blocks are still resident.
    assert cache.allocate("b", hs, 0, len(p)) == 64
    assert cache.num_tokens_of("b") == 64
    cache.free("b")
    # Recompute after preemption: prompt_len covers prompt + generated tokens, so the
    # whole prompt may hit.
    assert cache.allocate("c", hs, 90, 90) == 80
    cache.free("c")
    cache.assert_empty()


def test_duplicate_concurrent_prefill_stays_private():
    cache = PagedKVCache(32, BS)
    p = _rand(50, 10)
    hs = block_hashes(p, BS)
    assert cache.allocate("a", hs, 50, 50) == 0
    assert cache.allocate("b", hs, 50, 50) == 0  # nothing committed yet
    assert cache.commit_full_blocks("a", hs, 50) == 3
    assert cache.commit_full_blocks("b", hs, 50) == 0  # a's copies stay registered
    assert cache.num_cached_blocks == 3
    assert cache.shared_blocks == 0
    b_blocks = cache.blocks_of("b")
    cache.free("a")
    assert cache.num_evictable_blocks == 3
    # Evict a's registered copies while b lives: b's duplicates still stay private.
    assert cache.allocate("x", [], 28 * BS, 28 * BS) == 0
    assert cache.num_evictions == 3
    assert cache.num_cached_blocks == 0
    assert cache.commit_full_blocks("b", hs, 50) == 0
    assert cache.num_cached_blocks == 0
    cache.free("x")
    cache.free("b")
    assert all(cache.block_hash_of(blk) is None for blk in b_blocks)
    assert cache.num_evictable_blocks == 0
    cache.assert_empty()


def test_prefix_caching_disabled():
    cache = PagedKVCache(32, BS, enable_prefix_caching=False)
    p = _rand(80, 11)
    assert _admit(cache, "a", p) == 0
    assert cache.num_cached_blocks == 0
    assert _admit(cache, "b", p) == 0
    assert cache.shared_blocks == 0
    cache.free("a")
    cache.free("b")
    assert cache.num_evictable_blocks == 0
    cache.assert_empty()


# ------------------------------------------------------------------ eviction
def test_lru_eviction_order_and_evicted_block_no_longer_hits():
    bs = 4
    cache = PagedKVCache(8, bs)
    a = _rand(4 * bs + 1, 20)  # 5 blocks, 4 full and cached
    _admit(cache, "a", a)
    a_blocks = cache.blocks_of("a")
    cache.free("a")
    assert cache.num_evictable_blocks == 4
    ha = block_hashes(a, bs)
    assert cache.prefix_hit_tokens_lookup(ha, len(a)) == 16
    # 8 blocks: 4 evictable (a's full blocks) + 4 plain. Plain blocks go first.
    _admit(cache, "x", _rand(4 * bs, 21))  # uses the 4 plain blocks
    assert cache.num_evictions == 0
    assert cache.prefix_hit_tokens_lookup(ha, len(a)) == 16
    # The next allocation evicts a's LAST block first (freed in reverse order).
    assert cache.grow("x", 4 * bs + 1)
    assert cache.num_evictions == 1
    assert a_blocks[3] in cache.blocks_of("x")
    assert cache.prefix_hit_tokens_lookup(ha, len(a)) == 12
    assert cache.grow("x", 5 * bs + 1)
    assert a_blocks[2] in cache.blocks_of("x")
    assert cache.prefix_hit_tokens_lookup(ha, len(a)) == 8
    assert cache.num_cached_blocks == 2 + 4  # a's first two + x's four committed blocks
    assert cache.num_evictions == 2
    cache.free("x")
    assert cache.num_evictable_blocks == 6  # x's two decode blocks went to the plain pool
    cache.assert_empty()


def test_lru_order_across_sequences_and_touch_on_hit():
    bs = 4
    cache = PagedKVCache(6, bs)
    a, b = _rand(2 * bs + 1, 30), _rand(2 * bs + 1, 31)  # 3 blocks each, 2 cached
    _admit(cache, "a", a)
    _admit(cache, "b", b)
    cache.free("a")  # LRU: a1 a0
    cache.free("b")  # LRU: a1 a0 b1 b0
    # Hit a again: a's blocks leave the LRU; freeing moves them to the tail.
    assert _admit(cache, "a2", a) == 8
    cache.free("a2")  # LRU: b1 b0 a1 a0
    ha, hb = block_hashes(a, bs), block_hashes(b, bs)
    # Need 6 blocks: 2 plain + evict 4 (all of LRU). Do it stepwise to see the order.
    _admit(cache, "y", _rand(3 * bs, 32))  # 3 blocks: 2 plain + evict b1
    assert cache.prefix_hit_tokens_lookup(hb, len(b)) == 4
    assert cache.prefix_hit_tokens_lookup(ha, len(a)) == 8
    assert cache.grow("y", 4 * bs)  # evicts b0
    assert cache.prefix_hit_tokens_lookup(hb, len(b)) == 0
    assert cache.prefix_hit_tokens_lookup(ha, len(a)) == 8
    assert cache.num_evictions == 2
    cache.free("y")
    cache.assert_empty()


# ---------------------------------------------------------- failure atomicity
def test_allocate_failure_leaves_state_untouched():
    bs = 4
    cache = PagedKVCache(4, bs)
    a = _rand(3 * bs, 40)
    _admit(cache, "a", a)
    cache.free("a")  # 3 evictable + 1 plain
    # b hits a's 3 blocks but needs 2 more; reviving the hits leaves only 1 free block.
    b = _toks(a, _rand(2 * bs, 41))
    hb = block_hashes(b, bs)
    before = _snapshot(cache)
    assert cache.allocate("b", hb, len(b), len(b)) is None
    assert _snapshot(cache) == before
    assert "b" not in cache
    # With one new block needed it fits, without evicting its own hits.
    c = _toks(a, _rand(bs, 42))
    assert _admit(cache, "c", c) == 12
    assert cache.num_evictions == 0
    assert cache.num_free_blocks == 0
    before = _snapshot(cache)
    assert cache.allocate("d", [], 1, 1) is None
    assert _snapshot(cache) == before
    cache.free("c")
    cache.assert_empty()


def test_grow_across_boundaries_and_failure():
    cache = PagedKVCache(3, BS)
    assert cache.allocate("a", [], 16, 16) == 0
    assert len(cache.blocks_of("a")) == 1
    assert cache.grow("a", 16)  # no-op
    assert cache.grow("a", 17)
    assert len(cache.blocks_of("a")) == 2
    for t in range(18, 33):
        assert cache.grow("a", t)
    assert len(cache.blocks_of("a")) == 2
    assert cache.grow("a", 48)
    assert cache.num_free_blocks == 0
    before = _snapshot(cache)
    assert not cache.grow("a", 49)
    assert _snapshot(cache) == before
    assert cache.num_tokens_of("a") == 48
    with pytest.raises(ValueError, match="shrink"):
        cache.grow("a", 10)
    cache.free("a")
    # Multi-block jump (chunked prefill) in one call.
    assert cache.allocate("b", [], 1, 1) == 0
    assert cache.grow("b", 40)
    assert len(cache.blocks_of("b")) == 3
    assert cache.usage == 1.0
    cache.free("b")
    cache.assert_empty()


# ------------------------------------------------------------------ stats
def test_shared_stats():
    cache = PagedKVCache(64, BS)
    shared = _rand(2 * BS, 50)
    prompts = [_toks(shared, _rand(20, 51 + i)) for i in range(3)]
    for i, p in enumerate(prompts):
        _admit(cache, f"s{i}", p)
    # Each prompt: 52 tokens -> 4 blocks; 2 shared by all three.
    assert cache.num_used_blocks == 2 + 3 * 2
    assert cache.shared_blocks == 2
    assert cache.shared_refs == 6
    assert cache.num_free_blocks == 64 - 8
    assert cache.usage == pytest.approx(8 / 64)
    cache.free("s0")
    assert (cache.shared_blocks, cache.shared_refs) == (2, 4)
    cache.free("s1")
    assert (cache.shared_blocks, cache.shared_refs) == (0, 0)
    assert cache.num_used_blocks == 4
    cache.check_invariants()
    cache.free("s2")
    cache.assert_empty()


# ------------------------------------------------------------------ errors
def test_errors():
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCache(0)
    with pytest.raises(ValueError, match="block_size"):
        PagedKVCache(4, 0)
    cache = PagedKVCache(8, BS)
    cache.allocate("a", [], 5, 5)
    with pytest.raises(ValueError, match="already allocated"):
        cache.allocate("a", [], 5, 5)
    with pytest.raises(ValueError, match="block hashes"):
        cache.allocate("b", [1, 2], 20, 20)
    with pytest.raises(KeyError, match="unknown"):
        cache.grow("zz", 3)
    with pytest.raises(KeyError, match="unknown"):
        cache.free("zz")
    with pytest.raises(KeyError, match="unknown"):
        cache.commit_full_blocks("zz", [], 3)
    with pytest.raises(KeyError, match="unknown"):
        cache.blocks_of("zz")
    cache.free("a")
    with pytest.raises(KeyError, match="unknown"):
        cache.free("a")


def test_check_invariants_detects_corruption():
    cache = PagedKVCache(8, BS)
    _admit(cache, "a", _rand(40, 60))
    cache.check_invariants()
    cache._ref[cache.blocks_of("a")[0]] += 1
    with pytest.raises(KVCacheInvariantError, match="refcount"):
        cache.check_invariants()
    cache._ref[cache.blocks_of("a")[0]] -= 1
    cache.shared_refs += 1
    with pytest.raises(KVCacheInvariantError, match="shared_refs"):
        cache.check_invariants()
    cache.shared_refs -= 1
    cache._plain.append(cache.blocks_of("a")[2])
    with pytest.raises(KVCacheInvariantError, match="free"):
        cache.check_invariants()
    cache._plain.pop()
    h, b = next(iter(cache._hash_to_block.items()))
    cache._hash_to_block[h] = cache.blocks_of("a")[2]
    with pytest.raises(KVCacheInvariantError, match="hash map"):
        cache.check_invariants()
    cache._hash_to_block[h] = b
    cache.check_invariants()
    with pytest.raises(KVCacheInvariantError, match="still allocated"):
        cache.assert_empty()
    assert issubclass(KVCacheInvariantError, AssertionError)


# ------------------------------------------------------ independent model
class NaiveKV:
    """A slow, obviously-correct reference: linear scans, lists, no incremental stats.

    Block ids are its own (which uncached free block is handed out is unobservable);
    everything observable (hits, failures, evictions, cached counts) must agree.
    """

    def __init__(self, num_blocks: int, bs: int):
        self.bs = bs
        self.ref = [0] * num_blocks
        self.hash: list[int | None] = [None] * num_blocks
        self.lru: list[int] = []  # evictable, head first
        self.seqs: dict[str, list] = {}  # id -> [blocks, tokens, committed]
        self.evictions = 0

    def free_ids(self):
        return [b for b in range(len(self.ref)) if self.ref[b] == 0 and self.hash[b] is None]

    def lookup(self, hs, plen):
        hits = []
        for h in hs[: max(0, (plen - 1) // self.bs)]:
            match = [b for b in range(len(self.ref)) if self.hash[b] == h]
            assert len(match) <= 1
            if not match:
                break
            hits.append(match[0])
        return hits

    def take(self):
        plain = self.free_ids()
        if plain:
            b = plain[0]
        else:
            b = self.lru.pop(0)
            self.hash[b] = None
            self.evictions += 1
        self.ref[b] = 1
        return b

    def allocate(self, sid, hs, ntok, plen):
        hits = self.lookup(hs, plen)
        tokens = max(ntok, len(hits) * self.bs)
        need = -(-tokens // self.bs) - len(hits)
        avail = len(self.free_ids()) + len([b for b in self.lru if b not in hits])
        if need > avail:
            return None
        for b in hits:
            if b in self.lru:
                self.lru.remove(b)
            self.ref[b] += 1
        blocks = hits + [self.take() for _ in range(need)]
        self.seqs[sid] = [blocks, tokens, len(hits)]
        return len(hits) * self.bs

    def grow(self, sid, total):
        s = self.seqs[sid]
        need = -(-total // self.bs) - len(s[0])
        if need > len(self.free_ids()) + len(self.lru):
            return False
        s[0] += [self.take() for _ in range(max(0, need))]
        s[1] = total
        return True

    def commit(self, sid, hs, n):
        s = self.seqs[sid]
        end = min(n // self.bs, len(hs))
        for i in range(s[2], end):
            if hs[i] not in self.hash:
                self.hash[s[0][i]] = hs[i]
        s[2] = max(s[2], end)

    def free(self, sid):
        blocks = self.seqs.pop(sid)[0]
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0 and self.hash[b] is not None:
                self.lru.append(b)


BS_SM = 4
NB_SM = 24
_PREFIXES = [
    np.random.default_rng(100 + i).integers(0, 50, 6 * BS_SM, dtype=np.int32) for i in range(3)
]


class KVCacheMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    def __init__(self):
        super().__init__()
        self.cache = PagedKVCache(NB_SM, BS_SM)
        self.model = NaiveKV(NB_SM, BS_SM)
        self.live: dict[str, tuple[np.ndarray, list[int]]] = {}
        # Content model: physical block -> the token prefix whose KV it holds.
        self.content: dict[int, tuple[int, ...]] = {}
        self.counter = 0

    def _prefix(self, prompt, i):
        return tuple(prompt[: (i + 1) * BS_SM].tolist())

    @rule(
        target=seqs,
        which=st.integers(0, len(_PREFIXES) - 1),
        keep=st.integers(0, 6 * BS_SM),
        suffix=st.lists(st.integers(0, 3), max_size=2 * BS_SM),
        chunk=st.integers(0, 40),
    )
    def allocate(self, which, keep, suffix, chunk):
        prompt = _toks(_PREFIXES[which][:keep], suffix)
        if len(prompt) == 0:
            prompt = np.array([1], dtype=np.int32)
        hs = block_hashes(prompt, BS_SM)
        sid = f"s{self.counter}"
        self.counter += 1
        probe = self.cache.prefix_hit_tokens_lookup(hs, len(prompt))
        before = _snapshot(self.cache)
        n = min(chunk, len(prompt))
        hit = self.cache.allocate(sid, hs, n, len(prompt))
        assert hit == self.model.allocate(sid, hs, n, len(prompt))
        if hit is None:
            assert _snapshot(self.cache) == before
            return multiple()  # nothing added to the bundle
        assert hit == probe
        assert hit % BS_SM == 0 and hit < len(prompt)
        blocks = self.cache.blocks_of(sid)
        # Hit blocks really hold this prompt's prefix; fresh blocks hold nothing yet.
        for i, b in enumerate(blocks):
            if i < hit // BS_SM:
                assert self.content.get(b) == self._prefix(prompt, i)
            else:
                self.content.pop(b, None)
        self.live[sid] = (prompt, hs)
        return sid

    @rule(sid=seqs, extra=st.integers(1, 20))
    def grow(self, sid, extra):
        if sid not in self.live:
            return
        old = self.cache.blocks_of(sid)
        total = self.cache.num_tokens_of(sid) + extra
        before = _snapshot(self.cache)
        ok = self.cache.grow(sid, total)
        assert ok == self.model.grow(sid, total)
        if not ok:
            assert _snapshot(self.cache) == before
            return
        for b in self.cache.blocks_of(sid)[len(old) :]:
            self.content.pop(b, None)

    @rule(sid=seqs)
    def commit(self, sid):
        if sid not in self.live:
            return
        prompt, hs = self.live[sid]
        n = self.cache.num_tokens_of(sid)
        self.cache.commit_full_blocks(sid, hs, n)
        self.model.commit(sid, hs, n)
        for i, b in enumerate(self.cache.blocks_of(sid)[: min(n, len(prompt)) // BS_SM]):
            # Computed now (or a hit that already held it).
            self.content[b] = self._prefix(prompt, i)

    @rule(sid=consumes(seqs))
    def free(self, sid):
        if sid not in self.live:
            return
        self.cache.free(sid)
        self.model.free(sid)
        del self.live[sid]

    @invariant()
    def consistent(self):
        c, m = self.cache, self.model
        c.check_invariants()
        # Refcounts recomputed from the live sequences' block tables.
        refs = [0] * NB_SM
        for sid in self.live:
            for b in c.blocks_of(sid):
                refs[b] += 1
            assert c.num_tokens_of(sid) == m.seqs[sid][1]
            assert len(c.blocks_of(sid)) == len(m.seqs[sid][0])
        assert refs == [c.refcount(b) for b in range(NB_SM)]
        assert c.num_used_blocks == sum(r > 0 for r in refs)
        assert c.shared_blocks == sum(r >= 2 for r in refs)
        assert c.shared_refs == sum(r for r in refs if r >= 2)
        assert c.num_used_blocks + c.num_free_blocks == NB_SM
        # Observable agreement with the naive reference.
        assert c.num_evictions == m.evictions
        assert c.num_cached_blocks == sum(h is not None for h in m.hash)
        assert c.num_evictable_blocks == len(m.lru)
        assert sorted(m.ref) == sorted(c.refcount(b) for b in range(NB_SM))

    def teardown(self):
        for sid in list(self.live):
            self.cache.free(sid)
        self.cache.assert_empty()


KVCacheMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestKVCacheMachine = KVCacheMachine.TestCase
