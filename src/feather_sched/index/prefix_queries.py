"""The CHT's per-request prefix queries: what one request shares with the batch and the queue.

Each is one walk up the request's path (O(b): b = the divergence points on its chain), using
the chain property: counts along one chain never grow with depth. A mixin, so that policies
calling these per request per pass reach the index's state without an extra hop.
"""

from __future__ import annotations

from collections.abc import Callable

from feather_sched.index.chain import ChainNode, Key
from feather_sched.index.chain_store import ChainStore
from feather_sched.index.records import UnknownRequestError


class PrefixQueries:
    """Read-only prefix queries; the host index owns the state below."""

    _leaf: dict[str, ChainNode]
    _root: ChainNode
    _waiting: dict[str, None]
    _running: dict[str, None]
    _end_keys: dict[Key, ChainNode]
    _nodes: ChainStore
    _known: Callable[[str], str]

    def matched_chunks(self, request_id: str) -> int:
        """Leading chunks of this request held by at least one running request."""
        node, root = self._leaf.get(request_id), self._root
        if node is None:
            self._known(request_id)  # raises
        while node is not root and not node.running:
            node = node.parent  # type: ignore[assignment]
        return node.end

    def shared_prefix(self, request_id: str) -> tuple[int, Key | None, int]:
        """(depth, key, held): the deepest level this request shares with another waiting
        request (0: none), that level's key (None at 0), and the leading chunks a running
        request holds (`matched_chunks`). One walk up its path."""
        node, root = self._leaf.get(request_id), self._root
        if node is None:
            self._known(request_id)  # raises
        shared: ChainNode | None = None
        held = 0
        while node is not root:
            if shared is None and len(node.waiting) >= 2:
                shared = node
                if held:
                    break
            if not held and node.running:
                held = node.end
                if shared is not None:
                    break
            node = node.parent  # type: ignore[assignment]
        if shared is None:
            return 0, None, held
        return shared.end, shared.key, held

    def running_common_chunks(self) -> int:
        """Chunks shared by every running request (0 when nothing runs)."""
        n = len(self._running)
        if n == 0:
            return 0
        return self._deepest_running(self._leaf[next(iter(self._running))], n)

    def running_shared_chunks(self) -> int:
        """Leading chunks of the oldest running request that another running request also
        holds: the length of one prefix the batch shares (0 when none is shared). O(b)."""
        if len(self._running) < 2:
            return 0
        return self._deepest_running(self._leaf[next(iter(self._running))], 2)

    def lost_chunks(self, request_id: str) -> int:
        """Chunks of the running batch's common prefix that admitting this request would lose.

        0 means the batch stays exactly as homogeneous as it is (or nothing is running).
        """
        n = len(self._running)
        if n == 0:
            return 0
        common = self.running_common_chunks()
        node, root = self._leaf[self._known(request_id)], self._root
        while node is not root and node.running != n:
            node = node.parent  # type: ignore[assignment]
        return common - min(common, node.end)

    def group_size(self, request_id: str, chunks: int) -> int:
        """Waiting requests that share this request's first `chunks` chunks (itself included
        when it is waiting). `chunks` beyond its prompt counts only identical prompts."""
        node = self._leaf[self._known(request_id)]
        if chunks <= 0:
            return len(self._waiting)
        if chunks > node.end:
            return 0
        while node.start >= chunks:
            node = node.parent  # type: ignore[assignment]
        return len(node.waiting)

    def sharing_profile(self, request_id: str) -> tuple[int, int, int, int]:
        """One pass of what an admission decision needs about a waiting request:
        (matched, depth, group, holders) = chunks shared with the running batch; deepest
        level it shares with the batch or with another waiting request; waiting requests
        sharing that level; running requests holding it. O(b): one walk up its path."""
        node = self._leaf.get(request_id)
        if node is None:
            raise UnknownRequestError(f"request {request_id!r} is not in the index")
        root = self._root
        matched = 0
        shared: ChainNode | None = None  # deepest node with >= 2 waiting holders
        while node is not root:
            if shared is None and len(node.waiting) >= 2:
                shared = node
            if node.running:
                matched = node.end
                break
            node = node.parent  # type: ignore[assignment]
        if shared is not None and shared.end > matched:
            return matched, shared.end, len(shared.waiting), shared.running
        if matched == 0:
            return 0, 0, 1, 0
        return matched, matched, len(node.waiting), node.running

    def group_members(self, key: Key) -> list[str]:
        """Waiting ids holding `key`, oldest first. O(answer) for a key that ends a node (every
        key a query here hands out: group and match depths end nodes); a key inside a node is
        found by a scan over the nodes, once (the node is split there)."""
        node = self._end_keys.get(key)
        if node is None:
            node = self._nodes.find_inner(key)
        return list(node.waiting) if node is not None else []

    def _deepest_running(self, leaf: ChainNode, at_least: int) -> int:
        node, root = leaf, self._root
        while node is not root and node.running < at_least:
            node = node.parent  # type: ignore[assignment]
        return node.end
