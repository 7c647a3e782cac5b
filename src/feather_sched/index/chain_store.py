"""The CHT's storage: the implicit key tree kept path-compressed.

A node (`ChainNode`) is a run of levels held by exactly the same requests, so memory is ~8
bytes per distinct key, and a request's chain is a handful of nodes (one per divergence
point), not one entry per chunk. This module makes, splits, finds and drops nodes; who holds
a node (its waiting set and running count) is the index's business.
"""

from __future__ import annotations

import numpy as np

from feather_sched.index.chain import EMPTY_CHAIN, ChainNode, Key, chain_of, deepest_true


class ChainStore:
    """The path-compressed key tree: `root` (no levels) and every live node by its last key.

    Every chain inserted ends on a node boundary (nodes are split there), so a request is
    one leaf pointer. Splitting keeps the lower part as the same object: a node keeps its
    last key, and so its leaf role and its entry in `end_keys`."""

    __slots__ = ("end_keys", "root")

    def __init__(self) -> None:
        self.root = ChainNode(None, 0, EMPTY_CHAIN)
        self.root.children = {}
        self.end_keys: dict[Key, ChainNode] = {}

    def path(self, leaf: ChainNode) -> list[ChainNode]:
        """The nodes from level 0 down to `leaf` (empty for an empty prompt)."""
        path = []
        root = self.root
        node = leaf
        while node is not root:
            path.append(node)
            node = node.parent  # type: ignore[assignment]
        path.reverse()
        return path

    def insert(self, d: np.ndarray) -> list[ChainNode]:
        """Find or make the nodes of chain `d` (non-empty): walk down while it matches,
        split where it leaves a node, and hang the rest below as one new leaf."""
        n = len(d)
        node = self.root
        level = 0
        path: list[ChainNode] = []
        while True:
            children = node.children
            child = children.get(d.item(level)) if children else None
            if child is None:
                path.append(self._new_node(node, level, d[level:].copy()))
                return path
            lim = min(child.end, n)
            seg, start = child.seg, child.start
            if seg.item(lim - 1 - start) == d.item(lim - 1):
                m = lim  # chained digests: equal at lim - 1 means equal all the way
            else:
                m = deepest_true(
                    lim, lambda i, seg=seg, start=start: seg.item(i - start) == d.item(i), level + 1
                )
            if m < child.end:
                child = self.split(child, m)
            path.append(child)
            if m == n:
                return path
            node, level = child, m

    def split(self, node: ChainNode, level: int) -> ChainNode:
        """Split `node` above `level` (start < level < end); returns the new upper part."""
        cut = level - node.start
        parent = node.parent
        assert parent is not None and 0 < cut < len(node.seg)
        upper = ChainNode(parent, node.start, node.seg[:cut].copy())
        upper.waiting = node.waiting.copy()
        upper.running = node.running
        upper.children = {node.seg.item(cut): node}
        parent.children[upper.seg.item(0)] = upper  # type: ignore[index]
        node.seg = node.seg[cut:].copy()
        node.start = level
        node.parent = upper
        self.end_keys[upper.key] = upper
        return upper

    def kill(self, path: list[ChainNode]) -> None:
        """Remove the nodes no request holds any more (a suffix of the path)."""
        end_keys = self.end_keys
        for node in reversed(path):
            if node.waiting or node.running:
                return
            parent = node.parent
            del parent.children[node.seg.item(0)]  # type: ignore[union-attr]
            del end_keys[node.key]
            node.alive = False

    def find_inner(self, key: Key) -> ChainNode | None:
        """The node holding `key` strictly inside it (O(nodes)); split so that it ends it."""
        level, digest = key
        for node in list(self.end_keys.values()):
            if node.start <= level < node.end and node.seg.item(level - node.start) == digest:
                return self.split(node, level + 1) if level + 1 < node.end else node
        return None

    def relocate(self, key: Key, gone: ChainNode) -> ChainNode | None:
        """`key` ended node `gone`, which has left the tree; requests that arrived since may
        hold the same prefix again. Walk down along gone's chain; split so that it ends a
        node. O(b log chunks) plus one copy of the chain."""
        level, digest = key
        d = chain_of(gone)
        node = self.root
        at = 0
        while True:
            children = node.children
            child = children.get(d.item(at)) if children else None
            if child is None:
                return None
            if level < child.end:
                if child.seg.item(level - child.start) != digest:
                    return None
                return self.split(child, level + 1) if level + 1 < child.end else child
            if child.seg.item(-1) != d.item(child.end - 1):
                return None
            node, at = child, child.end

    def _new_node(self, parent: ChainNode, start: int, seg: np.ndarray) -> ChainNode:
        node = ChainNode(parent, start, seg)
        if parent.children is None:
            parent.children = {}
        parent.children[seg.item(0)] = node
        self.end_keys[node.key] = node
        return node
