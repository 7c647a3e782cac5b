"""The CHT's heap of hot keys: keys the running batch holds that waiting requests match into.

Invariant (kept by the index's transitions): every waiting request's deepest key held by the
running batch is in the heap, deepest first. Entries go stale as requests move; they are
dropped lazily, and the heap is compacted when stale entries dominate, so its memory tracks
the batch. A mixin, so that the per-admission reads stay plain attribute reads on the index.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from feather_sched.index.chain import ChainNode, Key
from feather_sched.index.chain_store import ChainStore
from feather_sched.index.records import Candidate


class HotKeys:
    """Best-match queries over the hot-key heap; the host index owns the state below."""

    _leaf: dict[str, ChainNode]
    _nodes: ChainStore
    _running_keys: int  # distinct keys held by running requests: bounds the heap's size
    _hot: list[tuple[int, int, Key]]  # (-level, push order, key)
    _in_hot: dict[Key, ChainNode]  # key -> the node it ends (re-found if that node left)
    _hot_seq: int

    def best_candidate(self) -> Candidate | None:
        """The waiting request that shares the most leading chunks with the running batch.

        None when no waiting request shares even one chunk with a running one (or nothing
        runs); callers then fall back to e.g. the largest group or arrival order.
        """
        rid = self.best_waiting()
        if rid is None:
            return None
        return Candidate(rid, self._hot[0][2][0] + 1, self._leaf[rid].end)

    def best_waiting(self) -> str | None:
        """The request id `best_candidate` names, without building its `Candidate`. The
        usual case, a live head and no compaction due, is read inline."""
        hot = self._hot
        if hot and (len(hot) <= 64 or len(hot) <= 4 * self._running_keys):
            node = self._in_hot[hot[0][2]]
            if node.alive and node.running and node.waiting:
                return next(iter(node.waiting))
        self._drop_stale_hot()
        if not self._hot:
            return None
        return next(iter(self._in_hot[self._hot[0][2]].waiting))

    def candidates(self, limit: int | None = None) -> Iterator[Candidate]:
        """Waiting requests ordered by most chunks shared with the running batch (ties: oldest
        first), each at most once. Only requests sharing >= 1 chunk are yielded.

        Lazy and read-only: stops as soon as the caller stops; cost is O(keys visited x log),
        independent of the queue length. Do not mutate the index while iterating.
        """
        self._drop_stale_hot()
        if not self._hot:
            return
        popped: list[tuple[int, int, Key]] = []
        seen: set[str] = set()
        yielded = 0
        try:
            while self._hot and (limit is None or yielded < limit):
                entry = heapq.heappop(self._hot)
                key = entry[2]
                node = self._hot_node(key)
                if node is None:
                    del self._in_hot[key]
                    continue
                popped.append(entry)
                matched = key[0] + 1
                for rid in node.waiting:
                    if rid in seen:
                        continue
                    seen.add(rid)
                    yield Candidate(rid, matched, self._leaf[rid].end)
                    yielded += 1
                    if limit is not None and yielded >= limit:
                        break
        finally:
            for entry in popped:
                heapq.heappush(self._hot, entry)

    def _hot_node(self, key: Key) -> ChainNode | None:
        """The node `key` (a heap entry) ends, when running and waiting requests both hold
        it; else None."""
        node = self._in_hot[key]
        if not node.alive:
            found = self._nodes.relocate(key, node)
            if found is None:
                return None
            self._in_hot[key] = node = found
        return node if node.running and node.waiting else None

    def _push_hot(self, node: ChainNode) -> None:
        key = node.key
        if key in self._in_hot:
            self._in_hot[key] = node  # same key: refresh the node (it may have been re-made)
            return
        self._in_hot[key] = node
        self._hot_seq += 1
        heapq.heappush(self._hot, (-key[0], self._hot_seq, key))

    def _drop_stale_hot(self) -> None:
        """Pop stale heap heads; compact if stale entries dominate (memory tracks the batch)."""
        hot = self._hot
        while hot and self._hot_node(hot[0][2]) is None:
            del self._in_hot[heapq.heappop(hot)[2]]
        if len(hot) > 64 and len(hot) > 4 * self._running_keys:
            live = [e for e in hot if self._hot_node(e[2]) is not None]
            self._in_hot = {e[2]: self._in_hot[e[2]] for e in live}
            heapq.heapify(live)
            self._hot = live
