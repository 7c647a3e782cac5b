"""Chunked Hash Tree: prefix detection by chained chunk digests.

A prompt is hashed once into a chain of keys (`index.chain`: key `(i, digest_i)` names the
prefix through chunk `i`). The tree is implicit: "do these two prompts share chunks 0..i?" is
one dict lookup of the key at level `i`; no token is looked at again after hashing.

Chain property used everywhere below: if a request holds key `i`, every request holding the
same key also holds the same keys `0..i-1`. So counts along one request's chain never grow
with depth, and "deepest level still shared" is a binary search over its keys.

Collisions: two different prefixes of the same level collide with probability ~2^-64 per pair
(xxh3-64 is not cryptographic, but collisions need adversarial input). With 10^5 waiting
requests x 10^2 levels that is ~10^7 keys, so the odds of any collision are ~10^14 / 2^65
~ 3e-6 per index lifetime. A collision only mis-orders admissions: the engines keep their own
block hashes for KV reuse, so the index is advisory and can never corrupt a KV cache.

Storage: the implicit tree of keys is kept path-compressed (`ChainNode`: a run of levels held by
exactly the same requests, its digests in one uint64 array), so memory is ~8 bytes per
distinct key plus a few hundred bytes per request, and admitting, preempting or finishing a
request costs one step per divergence point of its chain, not one per chunk.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, KeysView, Sequence

import numpy as np

from feather_sched.index.chain import (  # noqa: F401 (chain names re-exported: callers import the index from here)
    EMPTY_CHAIN,
    ChainNode,
    Key,
    KeyChain,
    as_digest_array,
    chain_of,
    chunk_digest_array,
    chunk_digests,
    deepest_true,
)
from feather_sched.index.records import (  # noqa: F401 (re-exported, as the chain names)
    Candidate,
    CHTError,
    DuplicateRequestError,
    InvalidTransitionError,
    RequestState,
    UnknownRequestError,
)

_ABSENT = object()


class ChunkedHashTree:
    """Prefix index over waiting and running requests, keyed by chained chunk digests.

    The implicit key tree is stored path-compressed: a node is a run of levels held by
    exactly the same requests, so a chain that only one request uses is one node (its
    digests in one uint64 array), and a request is one leaf pointer. Per node: the ordered
    set of its waiting holders and a count of its running holders. Admission, preemption and
    finish touch each node on the request's path once (O(b): b = the divergence points on
    its chain, 1-3 in prefix-group traffic), never each chunk. Queries walk the same path.
    A heap holds the running batch's keys that waiting requests match into (`candidates`).
    Arrival costs one O(chunks) vectorised copy of the digests (and the hashing when given
    tokens) plus O(b log chunks) comparisons to find where it leaves the tree.
    """

    def __init__(self, chunk_size: int = 64) -> None:
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = int(chunk_size)
        self._root = ChainNode(None, 0, EMPTY_CHAIN)
        self._root.children = {}
        self._leaf: dict[str, ChainNode] = {}  # every request, in the order it was added
        # Membership: one record a request, in the map of its state (the keys double as the
        # hosts' id sets: `waiting_set`, `running_set`); _running in admission order.
        self._waiting: dict[str, None] = {}
        self._running: dict[str, None] = {}
        self.waiting_set: KeysView[str] = self._waiting.keys()  # live views: C-speed
        self.running_set: KeysView[str] = self._running.keys()  # membership and set algebra
        self._end_keys: dict[Key, ChainNode] = {}  # every live node by the key of its last level
        self._running_keys = 0  # distinct keys held by running requests
        self._running_roots = 0  # distinct level-0 keys among running requests
        self._shared_roots = 0  # level-0 keys held by >= 2 requests (waiting or running)
        # keys held by the running batch that still have waiting requests, deepest first: at
        # least each waiting request's deepest such key (see admit); stale entries
        # are dropped lazily. _in_hot: key -> the node it ends (re-found if that node left).
        self._hot: list[tuple[int, int, Key]] = []
        self._in_hot: dict[Key, ChainNode] = {}
        self._hot_seq = 0

    # ------------------------------------------------------------------ sizes and lookups
    def __len__(self) -> int:
        return len(self._leaf)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._leaf

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_running_roots(self) -> int:
        """Distinct first chunks among running requests: the batch's prefix groups."""
        return self._running_roots

    @property
    def num_shared_roots(self) -> int:
        """First chunks held by two or more requests (waiting or running). 0 means no two
        requests share any prefix chunk at all (digests are chained), so every prefix-aware
        order degenerates to queue order: hosts use it to skip a policy for a step."""
        return self._shared_roots

    def state(self, request_id: str) -> RequestState:
        if request_id in self._running:
            return RequestState.RUNNING
        self._known(request_id)
        return RequestState.WAITING

    def total_chunks(self, request_id: str) -> int:
        """Levels of its chain (its prompt's chunks): a bound on any depth it shares. O(1)."""
        return self._leaf[self._known(request_id)].end

    def keys_of(self, request_id: str) -> KeyChain:
        """Its keys `(level, digest)`, level 0 first; `len()` is O(1), items are built on
        first access (O(chunks) then)."""
        return KeyChain(leaf=self._leaf[self._known(request_id)])

    def is_empty(self) -> bool:
        """True when no request and no per-key state remains (memory back to empty)."""
        return not self._leaf and not self._root.children and not self._end_keys and not self._hot

    # ------------------------------------------------------------------ updates
    def add(
        self,
        request_id: str,
        tokens: np.ndarray | Sequence[int] | None = None,
        *,
        digests: Sequence[int] | np.ndarray | None = None,
    ) -> KeyChain:
        """A request arrives in the waiting queue.

        Pass `tokens` to hash here, or `digests` already chained at this index's chunk size
        (e.g. vLLM's block hashes when chunk_size == block_size) to skip hashing.
        """
        if request_id in self._leaf:
            raise DuplicateRequestError(f"request {request_id!r} is already in the index")
        if (tokens is None) == (digests is None):
            raise ValueError("pass exactly one of tokens= or digests=")
        if digests is None:
            d = chunk_digest_array(tokens, self.chunk_size)  # type: ignore[arg-type]
        else:
            d = as_digest_array(digests)
        path = self._insert_chain(d) if len(d) else []
        self._leaf[request_id] = path[-1] if path else self._root
        self._waiting[request_id] = None
        if path and len(path[0].waiting) + path[0].running == 1:
            self._shared_roots += 1  # counted before the insert: 1 -> 2 holders
        self._add_waiting(request_id, path)
        return KeyChain(digests=d)

    def admit(self, request_id: str) -> None:
        """Waiting -> running (the scheduler admitted it).

        One walk up its path, leaf first: each node loses it as a waiting holder and counts
        it running. The heap invariant: every waiting request's deepest key held by the
        batch is in the heap. The keys this request newly brings into the batch (its nodes
        whose running count becomes 1) form a suffix of its chain; along it the waiting sets
        shrink with depth, and a waiting request's deepest match is where its set drops out.
        So only those drop-out nodes are pushed (fewer waiting holders below than here), not
        every hot key: a long prompt shared by a backlog has hundreds, and each would later
        be popped stale inside a scheduling decision. The pushes' order does not matter (one
        admission pushes distinct levels, all newer than the heap's entries)."""
        if self._waiting.pop(request_id, _ABSENT) is _ABSENT:
            self._expect(request_id, RequestState.WAITING, "admit")  # raises
        node, root = self._leaf[request_id], self._root
        below = 0  # waiting holders of the node under this one on the path
        while node is not root:
            waiting = node.waiting
            del waiting[request_id]
            running = node.running + 1
            node.running = running
            held = len(waiting)
            if running == 1:
                self._running_keys += node.end - node.start
                if node.start == 0:
                    self._running_roots += 1
                if below < held:
                    self._push_hot(node)
            below = held
            node = node.parent  # type: ignore[assignment]
        self._running[request_id] = None

    def preempt(self, request_id: str) -> None:
        """Running -> waiting (evicted by the engine, to be recomputed later)."""
        path = self._path(self._expect(request_id, RequestState.RUNNING, "preempt"))
        self._remove_running(path)
        del self._running[request_id]
        self._waiting[request_id] = None
        self._add_waiting(request_id, path)

    def finish(self, request_id: str) -> None:
        """Running -> gone (done generating)."""
        path = self._path(self._expect(request_id, RequestState.RUNNING, "finish"))
        self._drop_root(path)
        self._remove_running(path)
        del self._running[request_id]
        self._forget(request_id, path)

    def remove(self, request_id: str) -> None:
        """Drop a request in any state (abort, or removal from the waiting queue)."""
        path = self._path(self._leaf[self._known(request_id)])
        self._drop_root(path)
        if request_id in self._running:
            self._remove_running(path)
            del self._running[request_id]
        else:
            del self._waiting[request_id]
            for node in path:
                del node.waiting[request_id]
        self._forget(request_id, path)

    # ------------------------------------------------------------------ queries
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
        request holds (`matched_chunks`). One walk up its path, O(b): the binary search over
        `group_size` it replaces walked the path once a probe."""
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
            return self.num_waiting
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
            node = self._find_inner(key)
        return list(node.waiting) if node is not None else []

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
        """The request id `best_candidate` names, without building its `Candidate` (a
        frozen dataclass: ~1 us, on the admission hot path once per admission). The usual
        case, a live head and no compaction due, is read here without the calls of
        `_drop_stale_hot`."""
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

    def waiting_ids(self) -> Iterator[str]:
        """The waiting ids in the order they were first added."""
        waiting = self._waiting
        return (r for r in self._leaf if r in waiting)

    def running_ids(self) -> Iterator[str]:
        return iter(self._running)

    # ------------------------------------------------------------------ internals
    def _known(self, request_id: str) -> str:
        if request_id not in self._leaf:
            raise UnknownRequestError(f"request {request_id!r} is not in the index")
        return request_id

    def _expect(self, request_id: str, state: RequestState, op: str) -> ChainNode:
        if request_id not in self._leaf:
            raise UnknownRequestError(f"cannot {op} {request_id!r}: not in the index")
        actual = RequestState.RUNNING if request_id in self._running else RequestState.WAITING
        if actual is not state:
            raise InvalidTransitionError(
                f"cannot {op} {request_id!r}: it is {actual.value}, expected {state.value}"
            )
        return self._leaf[request_id]

    def _path(self, leaf: ChainNode) -> list[ChainNode]:
        """The nodes from level 0 down to `leaf` (empty for an empty prompt)."""
        path = []
        root = self._root
        node = leaf
        while node is not root:
            path.append(node)
            node = node.parent  # type: ignore[assignment]
        path.reverse()
        return path

    def _deepest_running(self, leaf: ChainNode, at_least: int) -> int:
        node, root = leaf, self._root
        while node is not root and node.running < at_least:
            node = node.parent  # type: ignore[assignment]
        return node.end

    # --- the compressed tree
    def _new_node(self, parent: ChainNode, start: int, seg: np.ndarray) -> ChainNode:
        node = ChainNode(parent, start, seg)
        if parent.children is None:
            parent.children = {}
        parent.children[seg.item(0)] = node
        self._end_keys[node.key] = node
        return node

    def _split(self, node: ChainNode, level: int) -> ChainNode:
        """Split `node` above `level` (start < level < end); returns the new upper part. The
        lower part stays the same object, so a node keeps its last key (and leaf role)."""
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
        self._end_keys[upper.key] = upper
        return upper

    def _insert_chain(self, d: np.ndarray) -> list[ChainNode]:
        """Find or make the nodes of chain `d` (non-empty): walk down while it matches,
        split where it leaves a node, and hang the rest below as one new leaf."""
        n = len(d)
        node = self._root
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
                child = self._split(child, m)
            path.append(child)
            if m == n:
                return path
            node, level = child, m

    def _kill(self, path: list[ChainNode]) -> None:
        """Remove the nodes no request holds any more (a suffix of the path)."""
        for node in reversed(path):
            if node.waiting or node.running:
                return
            parent = node.parent
            del parent.children[node.seg.item(0)]  # type: ignore[union-attr]
            del self._end_keys[node.key]
            node.alive = False

    def _find_inner(self, key: Key) -> ChainNode | None:
        """The node holding `key` strictly inside it (O(nodes)); split so that it ends it."""
        level, digest = key
        for node in list(self._end_keys.values()):
            if node.start <= level < node.end and node.seg.item(level - node.start) == digest:
                return self._split(node, level + 1) if level + 1 < node.end else node
        return None

    def _relocate(self, key: Key, gone: ChainNode) -> ChainNode | None:
        """`key` ended node `gone`, which has left the tree; requests that arrived since may
        hold the same prefix again. Walk down along gone's chain; split so that it ends a
        node. O(b log chunks) plus one copy of the chain."""
        level, digest = key
        d = chain_of(gone)
        node = self._root
        at = 0
        while True:
            children = node.children
            child = children.get(d.item(at)) if children else None
            if child is None:
                return None
            if level < child.end:
                if child.seg.item(level - child.start) != digest:
                    return None
                return self._split(child, level + 1) if level + 1 < child.end else child
            if child.seg.item(-1) != d.item(child.end - 1):
                return None
            node, at = child, child.end

    # --- counts and the hot heap
    def _drop_root(self, path: list[ChainNode]) -> None:
        """A request leaves the index: its root may stop being shared (2 -> 1 holders)."""
        if path and len(path[0].waiting) + path[0].running == 2:
            self._shared_roots -= 1

    def _forget(self, request_id: str, path: list[ChainNode]) -> None:
        del self._leaf[request_id]
        self._kill(path)
        if not self._leaf:  # nothing left: drop the lazily-kept heap state too
            self._hot.clear()
            self._in_hot.clear()

    def _hot_node(self, key: Key) -> ChainNode | None:
        """The node `key` (a heap entry) ends, when running and waiting requests both hold
        it; else None."""
        node = self._in_hot[key]
        if not node.alive:
            found = self._relocate(key, node)
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

    def _add_waiting(self, request_id: str, path: list[ChainNode]) -> None:
        """Arrival or preemption: join each node's waiting set, then put the request's deepest
        key held by the running batch in the heap (see admit)."""
        for node in path:
            node.waiting[request_id] = None
        for node in reversed(path):
            if node.running:
                self._push_hot(node)
                break

    def _remove_running(self, path: list[ChainNode]) -> None:
        """A request leaves the batch. The nodes no other running request holds form a suffix
        of its path; every waiting request that matched into them now matches to the node
        just above, so that one key is pushed (see admit)."""
        first_gone: ChainNode | None = None
        for node in path:
            r = node.running - 1
            node.running = r
            if r == 0:
                self._running_keys -= node.end - node.start
                if first_gone is None:
                    first_gone = node
                if node.start == 0:
                    self._running_roots -= 1
        if first_gone is not None and first_gone.start > 0:
            above = first_gone.parent
            if above is not None and above.waiting:
                self._push_hot(above)
