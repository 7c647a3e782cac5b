"""A flat CHT (one dict entry per chunk key), kept as a
reference: the path-compressed CHT must give exactly its answers, ties included (candidate
order decides admissions, so the simulator's decisions depend on it). Test-only code."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence

import numpy as np

# The chunk hashing is production's (tested on its own in test_cht.py): the reference is
# the flat *tree*, and both must see the same digests for their answers to be compared.
from feather_sched.index.chain import chunk_digests

# So are the request states, the candidate record and the misuse errors (index/records.py):
# what the reference checks is the tree's answers, and both name them alike.
from feather_sched.index.records import (
    Candidate,
    DuplicateRequestError,
    InvalidTransitionError,
    RequestState,
    UnknownRequestError,
)

Key = tuple[int, int]
"""(level, digest): the prefix through chunk `level` (0-based)."""


class ChunkedHashTree:
    """Prefix index over waiting and running requests, keyed by chained chunk digests.

    State: key -> ordered set of waiting ids (insertion order = arrival order); id -> its keys;
    key -> refcount over running requests; a heap of the running batch's keys that waiting
    requests match into (`candidates`). Every update is O(chunks of the request); every query
    the scheduler makes is O(log chunks) or O(answer), independent of the queue length.
    """

    def __init__(self, chunk_size: int = 64) -> None:
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = int(chunk_size)
        self._keys: dict[str, tuple[Key, ...]] = {}
        self._state: dict[str, RequestState] = {}
        self._waiting: dict[Key, dict[str, None]] = {}
        self._running_refs: dict[Key, int] = {}
        self._running: dict[str, None] = {}
        self._running_roots = 0  # distinct level-0 keys among running requests
        self._shared_roots = 0  # level-0 keys held by >= 2 requests (waiting or running)
        # keys held by the running batch that still have waiting requests, deepest first: at
        # least each waiting request's deepest such key (see _add_running); stale entries
        # are dropped lazily
        self._hot: list[tuple[int, int, Key]] = []
        self._in_hot: set[Key] = set()
        self._hot_seq = 0

    # ------------------------------------------------------------------ sizes and lookups
    def __len__(self) -> int:
        return len(self._state)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._state

    @property
    def num_waiting(self) -> int:
        return len(self._state) - len(self._running)

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
        return self._state[self._known(request_id)]

    def keys_of(self, request_id: str) -> tuple[Key, ...]:
        return self._keys[self._known(request_id)]

    def is_empty(self) -> bool:
        """True when no request and no per-key state remains (memory back to empty)."""
        return not self._state and not self._waiting and not self._running_refs and not self._hot

    # ------------------------------------------------------------------ updates
    def add(
        self,
        request_id: str,
        tokens: np.ndarray | Sequence[int] | None = None,
        *,
        digests: Sequence[int] | None = None,
    ) -> tuple[Key, ...]:
        """A request arrives in the waiting queue.

        Pass `tokens` to hash here, or `digests` already chained at this index's chunk size
        (e.g. vLLM's block hashes when chunk_size == block_size) to skip hashing.
        """
        if request_id in self._state:
            raise DuplicateRequestError(f"request {request_id!r} is already in the index")
        if (tokens is None) == (digests is None):
            raise ValueError("pass exactly one of tokens= or digests=")
        if digests is None:
            digests = chunk_digests(tokens, self.chunk_size)  # type: ignore[arg-type]
        keys = tuple((level, int(d)) for level, d in enumerate(digests))
        self._keys[request_id] = keys
        self._state[request_id] = RequestState.WAITING
        if keys and self._root_holders(keys[0]) == 1:
            self._shared_roots += 1  # counted before the insert: 1 -> 2 holders
        self._add_waiting(request_id, keys)
        return keys

    def admit(self, request_id: str) -> None:
        """Waiting -> running (the scheduler admitted it)."""
        keys = self._expect(request_id, RequestState.WAITING, "admit")
        self._remove_waiting(request_id, keys)
        self._add_running(keys)
        self._state[request_id] = RequestState.RUNNING
        self._running[request_id] = None

    def preempt(self, request_id: str) -> None:
        """Running -> waiting (evicted by the engine, to be recomputed later)."""
        keys = self._expect(request_id, RequestState.RUNNING, "preempt")
        self._remove_running(keys)
        del self._running[request_id]
        self._state[request_id] = RequestState.WAITING
        self._add_waiting(request_id, keys)

    def finish(self, request_id: str) -> None:
        """Running -> gone (done generating)."""
        keys = self._expect(request_id, RequestState.RUNNING, "finish")
        self._drop_root(keys)
        self._remove_running(keys)
        del self._running[request_id]
        self._forget(request_id)

    def remove(self, request_id: str) -> None:
        """Drop a request in any state (abort, or removal from the waiting queue)."""
        state = self._state.get(request_id)
        if state is None:
            raise UnknownRequestError(f"request {request_id!r} is not in the index")
        keys = self._keys[request_id]
        self._drop_root(keys)
        if state is RequestState.RUNNING:
            self._remove_running(keys)
            del self._running[request_id]
        else:
            self._remove_waiting(request_id, keys)
        self._forget(request_id)

    # ------------------------------------------------------------------ queries
    def matched_chunks(self, request_id: str) -> int:
        """Leading chunks of this request held by at least one running request."""
        keys = self._keys[self._known(request_id)]
        refs = self._running_refs
        return deepest_true(len(keys), lambda i: refs.get(keys[i], 0) > 0)

    def running_common_chunks(self) -> int:
        """Chunks shared by every running request (0 when nothing runs)."""
        n = len(self._running)
        if n == 0:
            return 0
        keys = self._keys[next(iter(self._running))]
        refs = self._running_refs
        return deepest_true(len(keys), lambda i: refs.get(keys[i], 0) == n)

    def running_shared_chunks(self) -> int:
        """Leading chunks of the oldest running request that another running request also
        holds: the length of one prefix the batch shares (0 when none is shared). O(log
        chunks)."""
        if len(self._running) < 2:
            return 0
        keys = self._keys[next(iter(self._running))]
        refs = self._running_refs
        return deepest_true(len(keys), lambda i: refs.get(keys[i], 0) >= 2)

    def lost_chunks(self, request_id: str) -> int:
        """Chunks of the running batch's common prefix that admitting this request would lose.

        0 means the batch stays exactly as homogeneous as it is (or nothing is running).
        """
        n = len(self._running)
        if n == 0:
            return 0
        common = self.running_common_chunks()
        keys = self._keys[self._known(request_id)]
        refs = self._running_refs
        kept = deepest_true(min(common, len(keys)), lambda i: refs.get(keys[i], 0) == n)
        return common - kept

    def group_size(self, request_id: str, chunks: int) -> int:
        """Waiting requests that share this request's first `chunks` chunks (itself included
        when it is waiting). `chunks` beyond its prompt counts only identical prompts."""
        keys = self._keys[self._known(request_id)]
        if chunks <= 0:
            return self.num_waiting
        if chunks > len(keys):
            return 0
        return len(self._waiting.get(keys[chunks - 1], ()))

    def sharing_profile(self, request_id: str) -> tuple[int, int, int, int]:
        """One pass of what an admission decision needs about a waiting request:
        (matched, depth, group, holders) = chunks shared with the running batch; deepest
        level it shares with the batch or with another waiting request; waiting requests
        sharing that level; running requests holding it. O(log chunks) dict lookups."""
        keys = self._keys.get(request_id)
        if keys is None:
            raise UnknownRequestError(f"request {request_id!r} is not in the index")
        refs = self._running_refs
        waiting = self._waiting
        # deepest level held by a running request, then shared with another waiting one
        matched = deepest_true(len(keys), lambda i: keys[i] in refs)
        depth = deepest_true(len(keys), lambda i: len(waiting.get(keys[i], ())) >= 2, matched)
        if depth == 0:
            return matched, 0, 1, 0
        key = keys[depth - 1]
        return matched, depth, len(waiting.get(key, ())), refs.get(key, 0)

    def group_members(self, key: Key) -> list[str]:
        """Waiting ids holding `key`, oldest first."""
        return list(self._waiting.get(key, ()))

    def best_candidate(self) -> Candidate | None:
        """The waiting request that shares the most leading chunks with the running batch.

        None when no waiting request shares even one chunk with a running one (or nothing
        runs); callers then fall back to e.g. the largest group or arrival order.
        """
        self._drop_stale_hot()
        if not self._hot:
            return None
        key = self._hot[0][2]
        rid = next(iter(self._waiting[key]))
        return Candidate(rid, key[0] + 1, len(self._keys[rid]))

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
                if not self._is_hot(key):
                    self._in_hot.discard(key)
                    continue
                popped.append(entry)
                matched = key[0] + 1
                for rid in self._waiting[key]:
                    if rid in seen:
                        continue
                    seen.add(rid)
                    yield Candidate(rid, matched, len(self._keys[rid]))
                    yielded += 1
                    if limit is not None and yielded >= limit:
                        break
        finally:
            for entry in popped:
                heapq.heappush(self._hot, entry)

    def waiting_ids(self) -> Iterator[str]:
        return (r for r, s in self._state.items() if s is RequestState.WAITING)

    def running_ids(self) -> Iterator[str]:
        return iter(self._running)

    # ------------------------------------------------------------------ internals
    def _known(self, request_id: str) -> str:
        if request_id not in self._state:
            raise UnknownRequestError(f"request {request_id!r} is not in the index")
        return request_id

    def _expect(self, request_id: str, state: RequestState, op: str) -> tuple[Key, ...]:
        actual = self._state.get(request_id)
        if actual is None:
            raise UnknownRequestError(f"cannot {op} {request_id!r}: not in the index")
        if actual is not state:
            raise InvalidTransitionError(
                f"cannot {op} {request_id!r}: it is {actual.value}, expected {state.value}"
            )
        return self._keys[request_id]

    def _root_holders(self, root: Key) -> int:
        members = self._waiting.get(root)
        return (len(members) if members else 0) + self._running_refs.get(root, 0)

    def _drop_root(self, keys: tuple[Key, ...]) -> None:
        """A request leaves the index: its root may stop being shared (2 -> 1 holders)."""
        if keys and self._root_holders(keys[0]) == 2:
            self._shared_roots -= 1

    def _forget(self, request_id: str) -> None:
        del self._state[request_id]
        del self._keys[request_id]
        if not self._state:  # nothing left: drop the lazily-kept heap state too
            self._hot.clear()
            self._in_hot.clear()

    def _is_hot(self, key: Key) -> bool:
        return key in self._running_refs and key in self._waiting

    def _push_hot(self, key: Key) -> None:
        if key in self._in_hot:
            return
        self._in_hot.add(key)
        self._hot_seq += 1
        heapq.heappush(self._hot, (-key[0], self._hot_seq, key))

    def _drop_stale_hot(self) -> None:
        hot = self._hot
        while hot and not self._is_hot(hot[0][2]):
            self._in_hot.discard(heapq.heappop(hot)[2])
        # compact if stale entries dominate, so memory tracks the live running set
        if len(hot) > 64 and len(hot) > 4 * len(self._running_refs):
            live = [e for e in hot if self._is_hot(e[2])]
            self._in_hot = {e[2] for e in live}
            heapq.heapify(live)
            self._hot = live

    def _add_waiting(self, request_id: str, keys: tuple[Key, ...]) -> None:
        # Hot path (every arrival and preemption): one dict insert per chunk, then one heap
        # entry for the request's deepest key held by the running batch (see _add_running).
        waiting = self._waiting
        for key in keys:
            members = waiting.get(key)
            if members is None:
                waiting[key] = {request_id: None}
            else:
                members[request_id] = None
        running = self._running_refs
        depth = deepest_true(len(keys), lambda i: keys[i] in running)
        if depth:
            self._push_hot(keys[depth - 1])

    def _remove_waiting(self, request_id: str, keys: tuple[Key, ...]) -> None:
        # Hot path (every admission): one dict delete per chunk.
        waiting = self._waiting
        for key in keys:
            members = waiting[key]
            if len(members) == 1:
                del waiting[key]
            else:
                del members[request_id]

    def _add_running(self, keys: tuple[Key, ...]) -> None:
        """A request joins the batch. The heap invariant: every waiting request's deepest key
        held by the batch is in the heap. The keys this request newly brings into the batch
        form a suffix of its chain; along it, the waiting sets shrink with depth, and a
        waiting request's deepest match is where its set drops out. So only those drop-out
        levels are pushed, not every hot key (a long prompt shared by a backlog has hundreds
        of them, and each would later be popped stale inside a scheduling decision)."""
        refs = self._running_refs
        for key in keys:
            n = refs.get(key, 0)
            refs[key] = n + 1
            if n == 0 and key[0] == 0:
                self._running_roots += 1
        waiting = self._waiting
        sizes = [len(waiting.get(key, ())) for key in keys]
        sizes.append(0)
        for level, key in enumerate(keys):
            if not sizes[level]:
                break  # waiting sets are nested along the chain: none deeper either
            if sizes[level + 1] < sizes[level] and refs[key] == 1:
                self._push_hot(key)

    def _remove_running(self, keys: tuple[Key, ...]) -> None:
        """A request leaves the batch. The keys no other running request holds form a suffix
        of its chain from level `first_gone`; every waiting request that matched into it now
        matches to the key just above, so that one key is pushed (see _add_running)."""
        refs = self._running_refs
        first_gone = len(keys)
        for level, key in enumerate(keys):
            n = refs[key] - 1
            if n:
                refs[key] = n
            else:
                del refs[key]
                first_gone = min(first_gone, level)
                if level == 0:
                    self._running_roots -= 1
        if 0 < first_gone < len(keys) and keys[first_gone - 1] in self._waiting:
            self._push_hot(keys[first_gone - 1])


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
