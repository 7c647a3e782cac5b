"""A port of Ray Serve LLM's `PrefixTree` (the tree behind `PrefixCacheAffinityRouter`).

Source: ray 2.60.0, `ray/llm/_internal/serve/routing_policies/prefix_aware/prefix_tree.py`.
Kept: the multi-tenant character-level radix tree, `insert` (splitting nodes, a tenant's
character count grows by a node's text the first time the tenant visits it), `prefix_match`
(descend while some available tenant owns the child; the matched tenants are those owning
the node the walk stopped at), `get_smallest_tenants`, `add_tenants`, `remove_tenants`.
Left out: the per-tenant LRU lists and the eviction loop (`do_eviction` is off by default in
Ray's router, so they never run there either) and the lock (this copy is single-threaded).

The simulator's prompts are token ids, not text: `tokens_to_text` maps each id to one
character, so a "character" here is a token and the match rate is the fraction of prompt
tokens matched (Ray's is of characters; with a fixed characters-per-token ratio the two
rates are equal).
"""

from __future__ import annotations

import os

import numpy as np


class _Node:
    __slots__ = ("children", "tenants", "text")

    def __init__(self, text: str = "") -> None:
        self.text = text
        self.children: dict[str, _Node] = {}
        self.tenants: dict[str, float] = {}  # tenant -> last access time


class PrefixTree:
    """Ray's multi-tenant prefix tree (see the module docstring for what is kept)."""

    def __init__(self) -> None:
        self.root = _Node()
        self.tenant_to_char_count: dict[str, int] = {}

    def add_tenants(self, tenants: list[str], time_s: float) -> None:
        for tenant in tenants:
            if tenant in self.tenant_to_char_count:
                continue
            self.tenant_to_char_count[tenant] = 0
            self.root.tenants[tenant] = time_s

    def insert(self, text: str, tenant: str, time_s: float) -> None:
        if tenant not in self.tenant_to_char_count:
            return  # as Ray: unknown tenants are ignored
        curr = self.root
        i = 0
        while i <= len(text):
            if tenant not in curr.tenants:
                self.tenant_to_char_count[tenant] += len(curr.text)
            curr.tenants[tenant] = time_s
            if i == len(text):
                break
            first = text[i]
            rest = text[i:]
            if first not in curr.children:
                curr.children[first] = _Node(rest)
            child = curr.children[first]
            shared = len(os.path.commonprefix([child.text, rest]))  # noqa: RUF071 (as Ray: characters)
            if shared < len(child.text):
                parent = _Node(child.text[:shared])
                parent.tenants = dict(child.tenants)
                child.text = child.text[shared:]
                parent.children[child.text[0]] = child
                curr.children[first] = parent
                curr = parent
            else:
                curr = child
            i += shared

    def prefix_match(
        self, text: str, available_tenants: list[str] | None = None
    ) -> tuple[str, list[str] | None]:
        if available_tenants:
            available_tenants = [t for t in available_tenants if t in self.tenant_to_char_count]
            if not available_tenants:
                return "", None
        else:
            available_tenants = list(self.tenant_to_char_count)
        curr = self.root
        i = 0
        while i < len(text):
            child = curr.children.get(text[i])
            if child is None:
                break
            if not any(t in child.tenants for t in available_tenants):
                break
            shared = len(os.path.commonprefix([child.text, text[i:]]))  # noqa: RUF071 (as Ray: characters)
            i += shared
            curr = child
            if shared < len(child.text):
                break
        matched = [t for t in available_tenants if t in curr.tenants] or None
        return text[:i], matched

    def get_smallest_tenants(self) -> list[str] | None:
        if not self.tenant_to_char_count:
            return None
        low = min(self.tenant_to_char_count.values())
        return [t for t, c in self.tenant_to_char_count.items() if c == low]

    def remove_tenants(self, tenants: list[str]) -> dict[str, int]:
        removed = {}
        for tenant in tenants:
            if tenant not in self.tenant_to_char_count:
                continue
            removed[tenant] = self.tenant_to_char_count.pop(tenant)
            self._drop(self.root, tenant)
        return removed

    def _drop(self, node: _Node, tenant: str) -> None:
        """Forget `tenant` below `node`. A child only `tenant` owns goes with its subtree (a
        node's owners include all its descendants' owners)."""
        stack = [node]
        while stack:
            n = stack.pop()
            n.tenants.pop(tenant, None)
            for key, child in list(n.children.items()):
                if tenant not in child.tenants:
                    continue
                if len(child.tenants) == 1:
                    del n.children[key]
                else:
                    stack.append(child)


def tokens_to_text(tokens: np.ndarray) -> str:
    """One character per token id (ids in the UTF-16 surrogate range are shifted past it),
    so Ray's character tree can run over token prompts."""
    t = np.asarray(tokens, dtype=np.uint32)
    t = np.where(t >= 0xD800, t + 0x800, t)
    return t.astype("<u4").tobytes().decode("utf-32-le")
