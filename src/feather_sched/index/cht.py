"""Chunked Hash Tree: prefix detection by chained chunk digests.

A prompt is hashed once into a chain of keys (`index.chain`: key `(i, digest_i)` names the
prefix through chunk `i`); "do two prompts share chunks 0..i?" is one lookup of the key at
level `i`. If a request holds key `i`, every holder of that key also holds keys `0..i-1`.
A collision (xxh3-64, ~2^-64 a pair) only mis-orders admissions: the engines keep their own
block hashes for KV reuse, so the index is advisory and cannot corrupt a KV cache.
"""

from __future__ import annotations

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
from feather_sched.index.chain_store import ChainStore
from feather_sched.index.hot_keys import HotKeys
from feather_sched.index.prefix_queries import PrefixQueries
from feather_sched.index.records import (  # noqa: F401 (re-exported, as the chain names)
    Candidate,
    CHTError,
    DuplicateRequestError,
    InvalidTransitionError,
    QueueSizes,
    RequestState,
    UnknownRequestError,
)

_ABSENT = object()


class ChunkedHashTree(QueueSizes, PrefixQueries, HotKeys):
    """Prefix index over waiting and running requests, keyed by chained chunk digests.

    Keys live in a path-compressed tree (`ChainStore`); a request is one leaf pointer. Per
    node: the ordered set of its waiting holders and a count of its running holders. This
    class owns membership and the transitions (arrival, admission, preemption, finish), each
    touching every node on the request's path once: O(b), b = the divergence points on its
    chain, never O(chunks). Queries are in `PrefixQueries`, best matches in `HotKeys`, the
    queue sizes in `QueueSizes`.
    """

    def __init__(self, chunk_size: int = 64) -> None:
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = int(chunk_size)
        self._nodes = ChainStore()
        self._root = self._nodes.root  # read by every walk up a path
        self._end_keys = self._nodes.end_keys  # every live node by the key of its last level
        self._leaf: dict[str, ChainNode] = {}  # every request, in the order it was added
        # Membership: one record a request, in the map of its state (the keys double as the
        # hosts' id sets: `waiting_set`, `running_set`); _running in admission order.
        self._waiting: dict[str, None] = {}
        self._running: dict[str, None] = {}
        self.waiting_set: KeysView[str] = self._waiting.keys()  # live views: C-speed
        self.running_set: KeysView[str] = self._running.keys()  # membership and set algebra
        self._running_keys = 0  # distinct keys held by running requests
        self._running_roots = 0  # distinct level-0 keys among running requests
        self._shared_roots = 0  # level-0 keys held by >= 2 requests (waiting or running)
        self._hot: list[tuple[int, int, Key]] = []  # see HotKeys
        self._in_hot: dict[Key, ChainNode] = {}
        self._hot_seq = 0

    # ------------------------------------------------------------------ sizes and lookups
    def __len__(self) -> int:
        return len(self._leaf)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._leaf

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
        path = self._nodes.insert(d) if len(d) else []
        self._leaf[request_id] = path[-1] if path else self._root
        self._waiting[request_id] = None
        if path and len(path[0].waiting) + path[0].running == 1:
            self._shared_roots += 1  # counted before the insert: 1 -> 2 holders
        self._add_waiting(request_id, path)
        return KeyChain(digests=d)

    def admit(self, request_id: str) -> None:
        """Waiting -> running (the scheduler admitted it).

        One walk up its path, leaf first: each node loses it as a waiting holder and counts
        it running. The keys it newly brings into the batch (running count becomes 1) form a
        suffix of its chain, along which waiting sets shrink with depth; a waiting request's
        deepest match is where its set drops out, so only those drop-out nodes are pushed to
        the hot heap (`HotKeys`' invariant), not every newly hot key, which would later be
        popped stale. Push order does not matter: one admission pushes distinct levels."""
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
        path = self._nodes.path(self._expect(request_id, RequestState.RUNNING, "preempt"))
        self._remove_running(path)
        del self._running[request_id]
        self._waiting[request_id] = None
        self._add_waiting(request_id, path)

    def finish(self, request_id: str) -> None:
        """Running -> gone (done generating)."""
        path = self._nodes.path(self._expect(request_id, RequestState.RUNNING, "finish"))
        self._drop_root(path)
        self._remove_running(path)
        del self._running[request_id]
        self._forget(request_id, path)

    def remove(self, request_id: str) -> None:
        """Drop a request in any state (abort, or removal from the waiting queue)."""
        path = self._nodes.path(self._leaf[self._known(request_id)])
        self._drop_root(path)
        if request_id in self._running:
            self._remove_running(path)
            del self._running[request_id]
        else:
            del self._waiting[request_id]
            for node in path:
                del node.waiting[request_id]
        self._forget(request_id, path)

    # ------------------------------------------------------------------ ids
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

    # --- membership counts and the hot-key invariant
    def _drop_root(self, path: list[ChainNode]) -> None:
        """A request leaves the index: its root may stop being shared (2 -> 1 holders)."""
        if path and len(path[0].waiting) + path[0].running == 2:
            self._shared_roots -= 1

    def _forget(self, request_id: str, path: list[ChainNode]) -> None:
        del self._leaf[request_id]
        self._nodes.kill(path)
        if not self._leaf:  # nothing left: drop the lazily-kept heap state too
            self._hot.clear()
            self._in_hot.clear()

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
