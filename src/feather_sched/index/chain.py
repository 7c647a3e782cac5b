"""Chains of chunk digests: the hashing pass, and the compressed path nodes the CHT stores.

A prompt is hashed once, left to right, with one streaming 64-bit xxh3 state over its int32
bytes; a digest is emitted at every chunk boundary and at the final partial chunk, so digest
`i` covers the whole prefix through chunk `i` and the key `(i, digest_i)` names that prefix.
A run of levels held by exactly the same requests is one `ChainNode` (its digests in one uint64
array); a request's chain is read back from its leaf (`KeyChain`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import xxhash

Key = tuple[int, int]
"""(level, digest): the prefix through chunk `level` (0-based)."""


def chunk_digests(tokens: np.ndarray | Sequence[int], chunk_size: int) -> list[int]:
    """Chained digests of `tokens`, one per chunk (the last one may cover a partial chunk).

    One streaming xxh3-64 pass over the int32 bytes: the digest after chunk `i` depends on
    every token up to the end of chunk `i`. An empty prompt has no digests.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    arr = np.ascontiguousarray(tokens, dtype=np.int32)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    data = memoryview(arr).cast("B")
    step = chunk_size * 4
    state = xxhash.xxh3_64()
    out: list[int] = []
    for start in range(0, len(data), step):
        state.update(data[start : start + step])
        out.append(state.intdigest())
    return out


def chunk_digest_array(tokens: np.ndarray | Sequence[int], chunk_size: int) -> np.ndarray:
    """`chunk_digests` as a uint64 array (what the index stores)."""
    return np.array(chunk_digests(tokens, chunk_size), dtype=np.uint64)


_MASK64 = 0xFFFF_FFFF_FFFF_FFFF
EMPTY_CHAIN = np.empty(0, dtype=np.uint64)


def as_digest_array(digests: Sequence[int] | np.ndarray) -> np.ndarray:
    """A chain as a fresh uint64 array (8 bytes a digest); ints outside 0..2^64-1 (e.g. a
    negative Python `hash`) are taken modulo 2^64."""
    if isinstance(digests, np.ndarray) and digests.dtype == np.uint64:
        return np.array(digests, dtype=np.uint64)  # a copy: the caller may reuse its array
    try:
        return np.array(digests, dtype=np.uint64).reshape(-1)
    except OverflowError:
        return np.array([int(d) & _MASK64 for d in digests], dtype=np.uint64)


class ChainNode:
    """A run of chain levels [start, end) that exactly the same requests hold (a compressed
    path of the implicit key tree). `seg` holds its digests (uint64, 8 bytes a level);
    `waiting` its waiting holders in the order they (re-)entered the queue; `running` how
    many running requests hold it. A request's chain ends at its *leaf*: the node whose end
    is its last level (nodes are split so that every chain ends on a node boundary)."""

    __slots__ = ("alive", "children", "end", "key", "parent", "running", "seg", "start", "waiting")

    def __init__(self, parent: ChainNode | None, start: int, seg: np.ndarray) -> None:
        self.parent = parent
        self.start = start
        self.end = start + len(seg)
        self.seg = seg
        self.key: Key = (self.end - 1, seg.item(-1)) if len(seg) else (-1, 0)
        self.children: dict[int, ChainNode] | None = None
        self.waiting: dict[str, None] = {}
        self.running = 0
        self.alive = True


class KeyChain(Sequence[Key]):
    """A request's keys `(level, digest)`, read-only and built on demand (a 128k-token prompt
    at chunk 16 has 8,000 of them: no tuple is made until one is asked for). Compares equal
    to the tuple of the same keys."""

    __slots__ = ("_digests", "_leaf")

    def __init__(self, digests: np.ndarray | None = None, leaf: ChainNode | None = None) -> None:
        self._digests = digests
        self._leaf = leaf

    def digests(self) -> np.ndarray:
        """The chain's digests, level 0 first (uint64)."""
        if self._digests is None:
            self._digests = chain_of(self._leaf)
        return self._digests

    def __len__(self) -> int:
        if self._digests is None:
            return self._leaf.end if self._leaf is not None else 0
        return len(self._digests)

    def __getitem__(self, i):  # type: ignore[override]
        d = self.digests()
        if isinstance(i, slice):
            return tuple((level, d.item(level)) for level in range(len(d))[i])
        n = len(d)
        level = i + n if i < 0 else i
        if not 0 <= level < n:
            raise IndexError("key index out of range")
        return (level, d.item(level))

    def __iter__(self) -> Iterator[Key]:
        return iter(tuple(enumerate(self.digests().tolist())))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyChain):
            return np.array_equal(self.digests(), other.digests())
        if isinstance(other, (tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"KeyChain({len(self)} keys)"


def chain_of(leaf: ChainNode | None) -> np.ndarray:
    """Digests from the root down to `leaf`, level 0 first (also for a removed leaf: nodes
    keep their parent and digests when they leave the tree)."""
    segs = []
    node = leaf
    while node is not None and node.parent is not None:
        segs.append(node.seg)
        node = node.parent
    if not segs:
        return EMPTY_CHAIN
    segs.reverse()
    return np.concatenate(segs)


def deepest_true(n: int, pred: Callable[[int], bool], lo: int = 0) -> int:
    """Largest m in [lo, n] such that pred(i) holds for every i in [lo, m) (levels below
    `lo` count as true), given that pred is monotone (true, then false: along one prefix
    chain, the requests holding a level only shrink with depth). O(log n) calls of pred: the
    one binary search every prefix-depth query shares."""
    hi = n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pred(mid - 1):
            lo = mid
        else:
            hi = mid - 1
    return lo
