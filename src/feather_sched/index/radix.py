"""Token-level radix tree: the reference prefix index, matched the way SGLang's radix cache is.

Edges hold token segments; a node's children are keyed by the first token of their segment; a
partial match of an edge splits it into a parent (the matched part) and a child (the rest), as
SGLang's `RadixCache.match_prefix`/`insert` do. Matching walks tokens, so its cost grows with
prompt length and, in an LPM pass, with the queue: that is the cost the CHT avoids. Used as the
oracle in tests and as the baseline in `feather index-bench`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from feather_sched.index.cht import DuplicateRequestError, UnknownRequestError


class _Node:
    __slots__ = ("children", "count", "ends", "parent", "segment")

    def __init__(self, segment: np.ndarray, parent: _Node | None) -> None:
        self.segment = segment
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.count = 0  # sequences whose path passes through this node (its subtree size)
        self.ends: dict[str, None] = {}  # ids whose sequence ends exactly here


def _common_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class RadixTree:
    """Sequences of token ids, each stored under an id, sharing common prefixes."""

    def __init__(self) -> None:
        self._root = _Node(np.empty(0, dtype=np.int32), None)
        self._seqs: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._seqs)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._seqs

    def num_nodes(self) -> int:
        stack, n = [self._root], 0
        while stack:
            node = stack.pop()
            n += 1
            stack.extend(node.children.values())
        return n

    # ------------------------------------------------------------------ updates
    def insert(self, request_id: str, tokens: np.ndarray | Sequence[int]) -> None:
        if request_id in self._seqs:
            raise DuplicateRequestError(f"request {request_id!r} is already in the radix tree")
        seq = np.ascontiguousarray(tokens, dtype=np.int32)
        self._seqs[request_id] = seq
        node = self._root
        node.count += 1
        pos = 0
        while pos < seq.size:
            child = node.children.get(int(seq[pos]))
            if child is None:
                leaf = _Node(seq[pos:].copy(), node)
                node.children[int(seq[pos])] = leaf
                node = leaf
                node.count += 1
                pos = seq.size
                break
            m = _common_length(child.segment, seq[pos:])
            if m < child.segment.size:
                child = self._split(child, m)
            node = child
            node.count += 1
            pos += m
        node.ends[request_id] = None

    def remove(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            raise UnknownRequestError(f"request {request_id!r} is not in the radix tree")
        node = self._locate(seq)
        del node.ends[request_id]
        while node is not None:
            node.count -= 1
            parent = node.parent
            if node.count == 0 and parent is not None:
                del parent.children[int(node.segment[0])]
            node = parent

    # ------------------------------------------------------------------ queries
    def match_prefix(self, tokens: np.ndarray | Sequence[int], split: bool = True) -> int:
        """Length of the longest prefix of `tokens` that some stored sequence starts with.

        With `split` (SGLang's behaviour) a partially matched edge is split so that the match
        ends on a node boundary; the answer is the same either way.
        """
        seq = np.ascontiguousarray(tokens, dtype=np.int32)
        node, pos = self._root, 0
        while pos < seq.size:
            child = node.children.get(int(seq[pos]))
            if child is None:
                break
            m = _common_length(child.segment, seq[pos:])
            pos += m
            if m < child.segment.size:
                if split:
                    self._split(child, m)
                break
            node = child
        return pos

    def sequences_with_prefix(self, prefix: np.ndarray | Sequence[int]) -> set[str]:
        """Ids of all stored sequences that start with `prefix` (empty prefix: all of them)."""
        seq = np.ascontiguousarray(prefix, dtype=np.int32)
        node, pos = self._root, 0
        while pos < seq.size:
            child = node.children.get(int(seq[pos]))
            if child is None:
                return set()
            m = _common_length(child.segment, seq[pos:])
            if m < min(child.segment.size, seq.size - pos):
                return set()
            pos += m
            node = child
        return set(self._subtree_ids(node))

    # ------------------------------------------------------------------ internals
    def _split(self, child: _Node, m: int) -> _Node:
        """Cut `child`'s edge after m tokens; return the new middle node holding the first m."""
        parent = child.parent
        assert parent is not None and 0 < m < child.segment.size
        mid = _Node(child.segment[:m], parent)
        mid.count = child.count
        parent.children[int(child.segment[0])] = mid
        child.segment = child.segment[m:]
        child.parent = mid
        mid.children[int(child.segment[0])] = child
        return mid

    def _locate(self, seq: np.ndarray) -> _Node:
        node, pos = self._root, 0
        while pos < seq.size:
            node = node.children[int(seq[pos])]
            pos += node.segment.size
        return node

    def _subtree_ids(self, node: _Node) -> Iterator[str]:
        stack = [node]
        while stack:
            n = stack.pop()
            yield from n.ends
            stack.extend(n.children.values())
