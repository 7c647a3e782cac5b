"""The Chunked Hash Tree against the token radix tree (the oracle), plus edge cases."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from feather_sched.index import (
    ChunkedHashTree,
    DuplicateRequestError,
    InvalidTransitionError,
    RadixTree,
    RequestState,
    UnknownRequestError,
    chunk_digests,
)
from flat_cht_reference import ChunkedHashTree as FlatCHT

# A few base sequences; prompts are a prefix of one of them plus a short random tail, so
# prompts share prefixes of every length, including exact duplicates and chunk-unaligned ones.
_BASES = [np.random.default_rng(i).integers(0, 50, 64).astype(np.int32) for i in range(3)]

prompts = st.builds(
    lambda base, cut, tail: np.concatenate([_BASES[base][:cut], np.array(tail, dtype=np.int32)]),
    st.integers(0, len(_BASES) - 1),
    st.integers(0, 40),
    st.lists(st.integers(0, 3), max_size=6),
)


def shared_levels(lcp: int, len_a: int, len_b: int, chunk: int) -> int:
    """Leading equal chunk keys of two prompts with a common prefix of `lcp` tokens: every
    full chunk inside the common prefix, plus the final partial chunk when the two prompts
    are identical and end mid-chunk (that partial key covers exactly the same tokens)."""
    full = lcp // chunk
    return full + int(len_a == len_b == lcp and lcp % chunk != 0)


class CHTAgainstRadix(RuleBasedStateMachine):
    """Random arrival/admission/preemption/finish/abort sequences; CHT and radix must agree."""

    @initialize(chunk=st.sampled_from([1, 3, 4, 8, 16]))
    def setup(self, chunk: int) -> None:
        self.chunk = chunk
        self.cht = ChunkedHashTree(chunk)
        self.flat = FlatCHT(chunk)  # the flat index: same answers, ties included
        self.radix_waiting = RadixTree()
        self.radix_running = RadixTree()
        self.prompts: dict[str, np.ndarray] = {}
        self.next_id = 0

    def _pick(self, data: st.DataObject, tree: RadixTree) -> str:
        ids = sorted(r for r in self.prompts if r in tree)
        return data.draw(st.sampled_from(ids))

    def _to_running(self, rid: str) -> None:
        self.radix_waiting.remove(rid)
        self.radix_running.insert(rid, self.prompts[rid])

    @rule(prompt=prompts)
    def arrive(self, prompt: np.ndarray) -> None:
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.cht.add(rid, prompt)
        self.flat.add(rid, prompt)
        self.radix_waiting.insert(rid, prompt)
        self.prompts[rid] = prompt

    @precondition(lambda self: len(self.radix_waiting) > 0)
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        rid = self._pick(data, self.radix_waiting)
        self.cht.admit(rid)
        self.flat.admit(rid)
        self._to_running(rid)

    @precondition(lambda self: self.cht.best_candidate() is not None)
    @rule()
    def admit_best(self) -> None:
        cand = self.cht.best_candidate()
        assert cand is not None
        assert cand == self.flat.best_candidate()
        self.cht.admit(cand.request_id)
        self.flat.admit(cand.request_id)
        self._to_running(cand.request_id)

    @precondition(lambda self: len(self.radix_running) > 0)
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        rid = self._pick(data, self.radix_running)
        self.cht.preempt(rid)
        self.flat.preempt(rid)
        self.radix_running.remove(rid)
        self.radix_waiting.insert(rid, self.prompts[rid])

    @precondition(lambda self: len(self.radix_running) > 0)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = self._pick(data, self.radix_running)
        self.cht.finish(rid)
        self.flat.finish(rid)
        self.radix_running.remove(rid)
        del self.prompts[rid]

    @precondition(lambda self: len(self.prompts) > 0)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.prompts)))
        tree = self.radix_running if rid in self.radix_running else self.radix_waiting
        self.cht.remove(rid)
        self.flat.remove(rid)
        tree.remove(rid)
        del self.prompts[rid]

    @precondition(lambda self: self.cht.num_running > 0)
    @rule(limit=st.integers(1, 4))
    def peek_candidates(self, limit: int) -> None:
        """A partial read of the candidate order (it drops stale heap entries on the way)."""
        assert list(self.cht.candidates(limit)) == list(self.flat.candidates(limit))

    # ---------------------------------------------------------------- oracle helpers
    def expected_matched(self, rid: str) -> int:
        """Chunks of `rid` shared with the running batch, derived from the radix tree."""
        prompt = self.prompts[rid]
        lcp = self.radix_running.match_prefix(prompt)
        identical_running = any(
            self.prompts[o].size == prompt.size
            for o in self.radix_running.sequences_with_prefix(prompt)
        )
        full = lcp // self.chunk
        return full + int(
            lcp == prompt.size and prompt.size % self.chunk != 0 and identical_running
        )

    def expected_group(self, rid: str, chunks: int) -> set[str]:
        prompt = self.prompts[rid]
        covered = min(chunks * self.chunk, prompt.size)
        members = self.radix_waiting.sequences_with_prefix(prompt[:covered])
        if covered < chunks * self.chunk:  # partial last chunk: same length, same tokens
            members = {m for m in members if self.prompts[m].size == prompt.size}
        return members

    # ---------------------------------------------------------------- invariants
    @invariant()
    def counts_agree(self) -> None:
        assert self.cht.num_waiting == len(self.radix_waiting)
        assert self.cht.num_running == len(self.radix_running)
        assert set(self.cht.waiting_ids()) == set(self.prompts) - set(self.cht.running_ids())
        for rid in self.cht.running_ids():
            assert rid in self.radix_running
            assert self.cht.state(rid) is RequestState.RUNNING
        roots = {self.cht.keys_of(r)[0] for r in self.cht.running_ids() if self.cht.keys_of(r)}
        assert self.cht.num_running_roots == len(roots)
        firsts = Counter(p[: self.chunk].tobytes() for p in self.prompts.values() if len(p))
        assert self.cht.num_shared_roots == sum(1 for n in firsts.values() if n >= 2)

    @invariant()
    def shared_prefix_lengths_agree(self) -> None:
        for rid in self.cht.waiting_ids():
            assert self.cht.matched_chunks(rid) == self.expected_matched(rid), rid

    @invariant()
    def groups_agree(self) -> None:
        for rid in self.cht.waiting_ids():
            keys = self.cht.keys_of(rid)
            for depth in {1, len(keys) // 2 + 1, len(keys)}:
                if depth < 1 or depth > len(keys):
                    continue
                expected = self.expected_group(rid, depth)
                assert set(self.cht.group_members(keys[depth - 1])) == expected
                assert self.cht.group_size(rid, depth) == len(expected)

    @invariant()
    def sharing_profile_agrees(self) -> None:
        for rid in self.cht.waiting_ids():
            matched, depth, group, holders = self.cht.sharing_profile(rid)
            assert matched == self.expected_matched(rid)
            n_keys = len(self.cht.keys_of(rid))
            shared = max(
                (d for d in range(1, n_keys + 1) if len(self.expected_group(rid, d)) >= 2),
                default=0,
            )
            assert depth == max(matched, shared)
            if depth:
                assert group == len(self.expected_group(rid, depth))
                prompt = self.prompts[rid]
                covered = min(depth * self.chunk, prompt.size)
                running = self.radix_running.sequences_with_prefix(prompt[:covered])
                if covered < depth * self.chunk:
                    running = {r for r in running if self.prompts[r].size == prompt.size}
                assert holders == len(running)
            else:
                assert (group, holders) == (1, 0)

    @invariant()
    def candidates_are_ordered_and_complete(self) -> None:
        expected = {r: self.expected_matched(r) for r in self.cht.waiting_ids()}
        cands = list(self.cht.candidates())
        ids = [c.request_id for c in cands]
        assert len(ids) == len(set(ids)), "a candidate was yielded twice"
        assert set(ids) == {r for r, m in expected.items() if m > 0}
        matched = [c.matched_chunks for c in cands]
        assert matched == sorted(matched, reverse=True)
        for c in cands:
            assert c.matched_chunks == expected[c.request_id]
        best = self.cht.best_candidate()
        if cands:
            assert best is not None and best.matched_chunks == cands[0].matched_chunks
        else:
            assert best is None

    @invariant()
    def same_answers_as_flat_index(self) -> None:
        """Ties included: candidate order, best candidate, every per-request query."""
        assert list(self.cht.candidates()) == list(self.flat.candidates())
        assert self.cht.best_candidate() == self.flat.best_candidate()
        assert self.cht.running_common_chunks() == self.flat.running_common_chunks()
        assert self.cht.running_shared_chunks() == self.flat.running_shared_chunks()
        assert self.cht.num_shared_roots == self.flat.num_shared_roots
        assert self.cht.num_running_roots == self.flat.num_running_roots
        for rid in self.prompts:
            keys = self.cht.keys_of(rid)
            assert keys == self.flat.keys_of(rid)
            assert self.cht.sharing_profile(rid) == self.flat.sharing_profile(rid)
            assert self.cht.lost_chunks(rid) == self.flat.lost_chunks(rid)
            assert self.cht.matched_chunks(rid) == self.flat.matched_chunks(rid)
            for depth in range(0, len(keys) + 2):
                assert self.cht.group_size(rid, depth) == self.flat.group_size(rid, depth)
            shared = max(
                (d for d in range(1, len(keys) + 1) if self.flat.group_size(rid, d) >= 2),
                default=0,
            )
            key = keys[shared - 1] if shared else None
            held = self.flat.matched_chunks(rid)
            assert self.cht.shared_prefix(rid) == (shared, key, held)
            for key in keys:
                assert self.cht.group_members(key) == self.flat.group_members(key)

    @invariant()
    def homogeneity_agrees(self) -> None:
        running = list(self.cht.running_ids())
        if not running:
            assert self.cht.running_common_chunks() == 0
            return
        # brute force over token arrays: the common prefix of all running prompts
        first = self.prompts[running[0]]
        common = min(
            shared_levels(
                _lcp(first, self.prompts[r]), first.size, self.prompts[r].size, self.chunk
            )
            for r in running
        )
        assert self.cht.running_common_chunks() == common
        # the oldest running request's prefix held by another running one
        shared = max(
            (
                shared_levels(
                    _lcp(first, self.prompts[r]), first.size, self.prompts[r].size, self.chunk
                )
                for r in running[1:]
            ),
            default=0,
        )
        assert self.cht.running_shared_chunks() == shared
        for rid in self.cht.waiting_ids():
            prompt = self.prompts[rid]
            kept = min(
                shared_levels(
                    _lcp(prompt, self.prompts[r]), prompt.size, self.prompts[r].size, self.chunk
                )
                for r in running
            )
            assert self.cht.lost_chunks(rid) == common - min(common, kept)

    def teardown(self) -> None:
        if not hasattr(self, "cht"):
            return
        for rid in list(self.prompts):
            self.cht.remove(rid)
        assert len(self.cht) == 0
        assert self.cht.is_empty(), "index did not return to empty"
        assert not self.cht._root.children and not self.cht._end_keys  # no node left


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


CHTAgainstRadix.TestCase.settings = settings(
    max_examples=300, stateful_step_count=30, deadline=None
)
TestCHTAgainstRadix = CHTAgainstRadix.TestCase


# -------------------------------------------------------------------- edge cases
def test_empty_prompt_has_no_keys_and_shares_nothing() -> None:
    cht = ChunkedHashTree(4)
    assert cht.add("e", np.array([], dtype=np.int32)) == ()
    cht.add("x", np.arange(8))
    cht.admit("x")
    assert cht.matched_chunks("e") == 0
    assert cht.lost_chunks("e") == cht.running_common_chunks() == 2
    cht.admit("e")
    assert cht.running_common_chunks() == 0
    cht.finish("e")
    cht.finish("x")
    assert cht.is_empty()


def test_prompt_shorter_than_a_chunk_is_one_partial_key() -> None:
    cht = ChunkedHashTree(16)
    short = np.arange(5)
    keys = cht.add("s", short)
    assert len(keys) == 1 and keys[0][0] == 0
    cht.add("same", short.copy())
    cht.add("longer", np.arange(6))  # same 5 tokens then more: a different partial key
    assert cht.group_size("s", 1) == 2
    cht.admit("s")
    assert cht.matched_chunks("same") == 1
    assert cht.matched_chunks("longer") == 0


def test_chunk_digests_chain_and_boundaries() -> None:
    tokens = np.arange(100, dtype=np.int32)
    d = chunk_digests(tokens, 16)
    assert len(d) == 7  # 6 full chunks + one partial
    assert chunk_digests(tokens[:64], 16) == d[:4]
    other = tokens.copy()
    other[0] = 999  # changing the first token changes every later digest
    assert all(x != y for x, y in zip(chunk_digests(other, 16), d))
    assert chunk_digests(list(range(100)), 16) == d
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_digests(tokens, 0)


def test_precomputed_digests_equal_hashing_here() -> None:
    tokens = np.arange(40)
    a, b = ChunkedHashTree(8), ChunkedHashTree(8)
    assert a.add("r", tokens) == b.add("r", digests=chunk_digests(tokens, 8))
    with pytest.raises(ValueError, match="exactly one"):
        a.add("q")


def test_misuse_gives_clear_errors() -> None:
    cht = ChunkedHashTree(4)
    cht.add("a", np.arange(8))
    with pytest.raises(DuplicateRequestError, match="'a' is already in the index"):
        cht.add("a", np.arange(8))
    with pytest.raises(UnknownRequestError, match="'ghost' is not in the index"):
        cht.remove("ghost")
    with pytest.raises(UnknownRequestError, match="ghost"):
        cht.admit("ghost")
    with pytest.raises(InvalidTransitionError, match="it is waiting, expected running"):
        cht.finish("a")
    cht.admit("a")
    with pytest.raises(InvalidTransitionError, match="it is running, expected waiting"):
        cht.admit("a")
    with pytest.raises(ValueError, match="chunk_size"):
        ChunkedHashTree(0)
    radix = RadixTree()
    radix.insert("a", [1, 2])
    with pytest.raises(DuplicateRequestError):
        radix.insert("a", [1, 2])
    with pytest.raises(UnknownRequestError, match="radix tree"):
        radix.remove("b")


def test_candidates_prefer_deepest_match_then_oldest() -> None:
    cht = ChunkedHashTree(4)
    base = np.arange(16)
    cht.add("run", base)
    cht.admit("run")
    cht.add("old_shallow", np.r_[base[:4], [90, 91, 92, 93]])
    cht.add("deep", np.r_[base[:12], [80, 81, 82, 83]])
    cht.add("new_shallow", np.r_[base[:4], [70, 71, 72, 73]])
    cht.add("stranger", np.arange(100, 116))
    order = [c.request_id for c in cht.candidates()]
    assert order == ["deep", "old_shallow", "new_shallow"]
    assert [c.request_id for c in cht.candidates(limit=2)] == ["deep", "old_shallow"]
    best = cht.best_candidate()
    assert best is not None and best.total_chunks - best.matched_chunks == 1
    # iteration is read-only: asking again gives the same answer
    assert [c.request_id for c in cht.candidates()] == order


def test_radix_split_keeps_answers() -> None:
    radix = RadixTree()
    radix.insert("a", np.arange(10))
    assert radix.match_prefix(np.r_[np.arange(4), [77]]) == 4  # splits the edge at 4
    assert radix.num_nodes() == 3
    assert radix.match_prefix(np.arange(10)) == 10
    assert radix.sequences_with_prefix(np.arange(4)) == {"a"}
    radix.remove("a")
    assert radix.num_nodes() == 1 and len(radix) == 0
