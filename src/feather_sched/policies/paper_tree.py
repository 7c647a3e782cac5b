"""The authors' chunked hash tree, as their queues read it: order and features in 50-token chunks.

Faithful to the authors' code point by point, defects included: docs/policies.md, "The
authors' policies, point by point"."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

import numpy as np

from feather_sched.index.chain import chunk_digests
from feather_sched.index.cht import RequestState
from feather_sched.policies.base import SchedulerView

PAPER_CHUNK_TOKENS = 50
"""The authors' chunk size in both policies (`ChunkedHashTree_RL(chunk_size=50)` in
policy_request_queues.py; `CHUNK_SIZE = 50` in the pull request's FeatherRequestQueue)."""

Key = tuple[int, int]
RUNNING = RequestState.RUNNING


class PaperTree:
    """The authors' tree state for one run: missing counts, active set, common chain."""

    def __init__(self, chunk_tokens: int = PAPER_CHUNK_TOKENS) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        self.chunk_tokens = chunk_tokens
        self._hashes: dict[str, list[int]] = {}
        self._seq: dict[str, int] = {}
        self._next_seq = 0
        self.waiting: dict[str, None] = {}
        """Inserted, not active: the requests `best` may offer."""
        self.active: set[str] = set()
        self.stuck: set[str] = set()
        """Active in the tree but back in the host's waiting queue (preempted)."""
        self._refs: dict[Key, int] = {}
        self._holders: dict[Key, set[str]] = {}
        self._missing: dict[str, int] = {}
        self._heap: list[tuple[int, int, str]] = []
        self.chain: list[int] = []

    # ------------------------------------------------------------------ the host's state
    def sync(self, view: SchedulerView) -> None:
        """Bring the tree to the host's running and waiting sets (once per step)."""
        running = set(view.index.running_ids())
        queued = list(view.waiting_ids())
        in_queue = set(queued)
        for rid in [r for r in self.active if r not in running]:
            if rid in in_queue:
                self.stuck.add(rid)  # preempted: still active to the tree
            else:
                self.finish(rid)
        for rid in [r for r in self.waiting if r not in in_queue]:
            if rid not in running:
                self.remove(rid)  # left the queue without running (aborted)
        for rid in queued:
            if rid not in self._hashes:
                self.insert(rid, view.request(rid).prompt)
        for rid in running:
            self.stuck.discard(rid)
            if rid not in self.active:
                if rid not in self._hashes:
                    self.insert(rid, view.request(rid).prompt)
                self.activate(rid)

    # ------------------------------------------------------------------ the tree's calls
    def insert(self, rid: str, tokens: np.ndarray | Sequence[int]) -> None:
        """A new waiting request: its keys, and its missing count against the working set."""
        if rid in self._hashes:
            return  # the authors' insert ignores an id it holds (the preemption defect)
        hashes = chunk_digests(tokens, self.chunk_tokens)
        self._hashes[rid] = hashes
        self._seq[rid] = self._next_seq
        self._next_seq += 1
        missing = 0
        for key in enumerate(hashes):
            missing += key not in self._refs
            self._holders.setdefault(key, set()).add(rid)
        self._missing[rid] = missing
        self.waiting[rid] = None
        heapq.heappush(self._heap, (missing, self._seq[rid], rid))

    def activate(self, rid: str) -> None:
        """`activate_request`: its keys join the working set; waiting holders miss one less."""
        self._drop_waiting(rid)
        self.active.add(rid)
        hashes = self._hashes[rid]
        for key in enumerate(hashes):
            self._refs[key] = self._refs.get(key, 0) + 1
            if self._refs[key] == 1:
                for other in self._holders.get(key, ()):
                    if self._missing[other] > 0:
                        self._missing[other] -= 1
                        heapq.heappush(self._heap, (self._missing[other], self._seq[other], other))
        if len(self.active) == 1:
            self.chain = list(hashes)
        else:
            self.chain = self.chain[: common_length(self.chain, hashes)]

    def finish(self, rid: str) -> None:
        """`finish_request`: its keys leave the working set; the common chain may grow."""
        self.active.discard(rid)
        self.stuck.discard(rid)
        for key in enumerate(self._hashes[rid]):
            self._refs[key] -= 1
            if self._refs[key] == 0:
                del self._refs[key]
                for other in self._holders.get(key, ()):
                    self._missing[other] += 1
                    heapq.heappush(self._heap, (self._missing[other], self._seq[other], other))
        self._forget(rid)
        self.chain = self._common_chain()

    def remove(self, rid: str) -> None:
        """`remove`: a waiting request gone without running."""
        self._drop_waiting(rid)
        self._forget(rid)

    # ------------------------------------------------------------------ the queue's reads
    def best(self) -> str | None:
        """`find_best_request`: fewest missing chunks, ties to the earliest enqueued."""
        heap = self._heap
        while heap:
            missing, _, rid = heap[0]
            if rid in self.waiting and self._missing.get(rid) == missing:
                return rid
            heapq.heappop(heap)  # stale: admitted, removed, or its count changed
        return None

    def features(self, rid: str) -> tuple[int, int, int]:
        """(chunks_before, chunks_after, requests_waiting) for candidate `rid`."""
        hashes = self._hashes[rid]
        before = len(self.chain)
        after = common_length(self.chain, hashes) if self.active else len(hashes)
        if after == 0 or after > before:
            return before, after, 0
        holders = self._holders.get((after - 1, self.chain[after - 1]), ())
        return before, after, len(holders)  # holders are the waiting, not-active requests

    # ------------------------------------------------------------------ internals
    def _drop_waiting(self, rid: str) -> None:
        if rid not in self.waiting:
            return
        del self.waiting[rid], self._missing[rid]
        for key in enumerate(self._hashes[rid]):
            holders = self._holders[key]
            holders.discard(rid)
            if not holders:
                del self._holders[key]

    def _forget(self, rid: str) -> None:
        self._hashes.pop(rid, None)
        self._seq.pop(rid, None)

    def _common_chain(self) -> list[int]:
        chains = [self._hashes[r] for r in self.active]
        if not chains:
            return []
        first = chains[0]
        n = min(len(c) for c in chains)
        for other in chains[1:]:
            n = min(n, common_length(first[:n], other))
        return list(first[:n])


def common_length(a: list[int], b: list[int]) -> int:
    """Levels two chains agree on from the start (chained digests: agreement is a prefix)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def paper_candidates(tree: PaperTree, view: SchedulerView) -> Iterator[str]:
    """The authors' queue, one `peek_request` at a time: the tree's best waiting request,
    re-read after each admission (their `pop_request` activates it, so the next best sees it
    running). Ends when the host did not admit the last candidate (it stopped the step)."""
    tree.sync(view)
    previous: str | None = None
    while True:
        if previous is not None:
            if previous not in view.index or view.index.state(previous) is not RUNNING:
                return
            tree.activate(previous)
        previous = tree.best()
        if previous is None:
            return
        yield previous
