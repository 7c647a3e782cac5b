"""SGLang's scheduling policies: lpm, dfs-weight, hrrn, lof and random (fcfs lives in `fcfs.py`).

Mirrors `python/sglang/srt/managers/schedule_policy.py` (SGLang 0.5.x): `SchedulePolicy.
calc_priority` sorts the whole waiting queue once per scheduling pass, then `PrefillAdder` walks
it greedily and stops at the first request that does not fit. Here `begin_step` plays
`calc_priority` over a snapshot of the host's queue, `candidates` yields that order lazily
(skipping ids that stopped waiting meanwhile) and `accept` is always ADD, because the host
stops on budgets exactly as `PrefillAdder` does.

The host's block-granular prefix cache plays SGLang's radix cache: a request's matched prefix
is `view.cached_blocks(rid) * view.block_size` tokens and its `last_node` is the end of its
first `cached_blocks` block hashes.
"""

from __future__ import annotations

import heapq
import math
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice

import numpy as np

from feather_sched.index.cht import RequestState, deepest_true
from feather_sched.index.radix import RadixTree
from feather_sched.policies.base import Policy, SchedulerView

__all__ = [
    "IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD",
    "IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD",
    "WAITING_QUEUE_PREFIX_MATCH_MAX",
    "DFSWeightPolicy",
    "HRRNPolicy",
    "LOFPolicy",
    "LPMPolicy",
    "RandomPolicy",
    "ShortestPrefillFirstPolicy",
    "dfs_weight_order",
]

WAITING_QUEUE_PREFIX_MATCH_MAX = 128
"""SGLang `_determine_active_policy`: above this many waiting, lpm degrades to fcfs."""
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
"""SGLang: requests with at most this many cached tokens get the in-batch check."""
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32
"""SGLang: an in-batch match of at least this many tokens defers the request this pass."""


def _is_waiting(view: SchedulerView, request_id: str) -> bool:
    index = view.index
    return request_id in index and index.state(request_id) is RequestState.WAITING


class _PrecomputedOrder(Policy):
    """Shared plumbing: an order computed once per step (SGLang's `calc_priority`), yielded
    lazily. If `candidates` is called without a fresh `begin_step`, the order is computed then."""

    def __init__(self) -> None:
        self._order: Iterable[str] | None = None

    @abstractmethod
    def _compute(self, view: SchedulerView) -> Iterable[str]:
        """This step's order over the waiting queue (SGLang's sort of `waiting_queue`)."""

    def begin_step(self, view: SchedulerView) -> None:
        self._order = self._compute(view)

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        order = self._order if self._order is not None else self._compute(view)
        self._order = None  # one order per begin_step, as calc_priority runs once per pass
        for rid in order:
            if _is_waiting(view, rid):
                yield rid

    def reset(self) -> None:
        self._order = None


class LPMPolicy(_PrecomputedOrder):
    """Longest prefix match first, with SGLang's in-batch prefix caching.

    Mirrors `SchedulePolicy._determine_active_policy` (fcfs above `prefix_match_max` waiting),
    `_compute_prefix_matches` (per-pass `waiting_queue_radix_tree`, reset every call) and
    `_sort_by_longest_prefix` (stable sort on -matched tokens, +inf when deprioritized).
    A negative `in_batch_check_threshold` disables in-batch caching, as in SGLang.
    """

    name = "lpm"

    def __init__(
        self,
        in_batch_check_threshold: int = IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD,
        in_batch_deprioritize_threshold: int = IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD,
        prefix_match_max: int = WAITING_QUEUE_PREFIX_MATCH_MAX,
    ) -> None:
        super().__init__()
        self.in_batch_check_threshold = int(in_batch_check_threshold)
        self.in_batch_deprioritize_threshold = int(in_batch_deprioritize_threshold)
        self.prefix_match_max = int(prefix_match_max)
        # Ids the in-batch check deferred in the last pass (for tests and reports).
        self.last_deprioritized: frozenset[str] = frozenset()

    def _compute(self, view: SchedulerView) -> Iterable[str]:
        if view.num_waiting > self.prefix_match_max:
            # SGLang turns matching and sorting off: plain queue order. Only the head can be
            # admitted this step, so snapshot no more than FCFS would.
            self.last_deprioritized = frozenset()
            return list(islice(view.waiting_ids(), view.max_num_seqs))
        ids, matched, deferred = self._prefix_matches(view)
        inf = math.inf
        return sorted(ids, key=lambda r: inf if r in deferred else -matched[r])

    def _prefix_matches(self, view: SchedulerView) -> tuple[list[str], dict[str, int], set[str]]:
        """SGLang `_compute_prefix_matches`: (queue, matched tokens per id, deferred ids)."""
        ids = list(view.waiting_ids())
        bs = view.block_size
        matched: dict[str, int] = {}
        deferred: set[str] = set()
        waiting_tree = RadixTree()  # SGLang's waiting_queue_radix_tree, fresh every pass
        for rid in ids:
            hit = view.cached_blocks(rid) * bs
            matched[rid] = hit
            if hit <= self.in_batch_check_threshold:
                # SGLang matches origin_input_ids + output_ids; the simulator has no generated
                # token ids, so a preempted request is matched on its prompt.
                prompt = view.request(rid).prompt
                if waiting_tree.match_prefix(prompt) >= self.in_batch_deprioritize_threshold:
                    deferred.add(rid)
                else:
                    waiting_tree.insert(rid, prompt)
        self.last_deprioritized = frozenset(deferred)
        return ids, matched, deferred


class HRRNPolicy(LPMPolicy):
    """Highest response ratio next, with token-based aging: SGLang `hrrn` (0.5.23).

    Mirrors `SchedulePolicy._sort_by_hrrn`: the scheduler counts prefill tokens processed so
    far (`processed_tokens_counter += batch.extend_num_tokens` per forward; here the
    prefill tokens each step reports in `end_step`), snapshots the counter when a request
    enters the waiting queue (`_add_request_to_queue`, again after a retraction: here when an
    id is first seen waiting, again after it left), and sorts by ratio = waited tokens /
    uncached prompt tokens, highest first; ties by request id (SGLang sorts on `(-ratio,
    rid)`). Requests with nothing left to prefill come first, those the in-batch prefix
    check defers last, as lpm's (`_compute_prefix_matches`). Like lpm it falls back to queue
    order above `prefix_match_max` waiting (`_determine_active_policy`).
    """

    name = "hrrn"

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.processed_tokens = 0
        self._entered: dict[str, int] = {}  # waiting id -> counter when it entered

    def _compute(self, view: SchedulerView) -> Iterable[str]:
        entered = {rid: self._entered.get(rid, self.processed_tokens) for rid in view.waiting_ids()}
        self._entered = entered  # ids that left the queue are forgotten: re-entry re-snapshots
        if view.num_waiting > self.prefix_match_max:
            self.last_deprioritized = frozenset()
            return list(islice(view.waiting_ids(), view.max_num_seqs))
        ids, matched, deferred = self._prefix_matches(view)
        done = self.processed_tokens
        inf = math.inf

        def key(rid: str) -> tuple[float, str]:
            if rid in deferred:
                return (inf, rid)
            uncached = max(0, view.request(rid).prompt_len - matched[rid])
            if uncached <= 0:
                return (-inf, rid)
            return (-(max(0, done - entered[rid]) / uncached), rid)

        return sorted(ids, key=key)

    def end_step(
        self, view: SchedulerView, step_time: float, batch_size: int, prefill_tokens: int = 0
    ) -> None:
        self.processed_tokens += int(prefill_tokens)

    def reset(self) -> None:
        super().reset()
        self.processed_tokens = 0
        self._entered = {}


class ShortestPrefillFirstPolicy(LPMPolicy):
    """Shortest uncached prefill first: SGLang's experimental `shortest-prefill-first` (0.5.23).

    Mirrors `SchedulePolicy._sort_by_shortest_prefill`: sort on (deferred by the in-batch
    prefix check, uncached prefill work = max(1, prompt - matched tokens), time it entered
    the waiting queue). Unlike lpm and hrrn, SGLang keeps sorting above 128 waiting (no
    fallback). Not modelled: its `shortest_prefill_chunk_limit`, which also caps a running
    chunked prefill to leave budget for shorter waiting ones (an engine-side change), and a
    preempted request's generated tokens in its work (the simulator matches prompts only).
    """

    name = "shortest-prefill-first"

    def _compute(self, view: SchedulerView) -> Iterable[str]:
        ids, matched, deferred = self._prefix_matches(view)

        def key(rid: str) -> tuple[bool, int, float]:
            work = max(1, view.request(rid).prompt_len - matched[rid])
            return (rid in deferred, work, view.arrival_time(rid))

        return sorted(ids, key=key)


class DFSWeightPolicy(_PrecomputedOrder):
    """Depth-first over the prefix tree, heaviest subtree first (SGLang `dfs-weight`).

    Mirrors `SchedulePolicy._sort_by_dfs_weight` with `_calc_weight` and `_get_dfs_priority`
    (0.5.23 moved both into `BasePrefixCache.dfs_weight_order`, iterative; same order). No
    fallback for long queues. SGLang also computes in-batch deprioritization for dfs-weight
    (`_compute_prefix_matches`) but never uses it in this sort, so it is skipped here.
    """

    name = "dfs-weight"

    def _compute(self, view: SchedulerView) -> Iterable[str]:
        ids = list(view.waiting_ids())
        return dfs_weight_order(ids, view.cached_blocks, view.block_hashes)


_Path = tuple[str, Sequence[int], int]
"""(request id, its block hashes, how many of them are cached)."""


def dfs_weight_order(
    ids: Sequence[str],
    cached_blocks: Callable[[str], int],
    block_hashes: Callable[[str], Sequence[int]],
) -> list[str]:
    """SGLang's dfs-weight order of `ids` (queue order) over their cached block-hash paths.

    A request's last node is the end of its first `cached_blocks(rid)` hashes; nothing cached
    means the root. Weight of a node = requests whose last node is in its subtree. The walk
    visits children heaviest first (ties: first created, i.e. first seen in queue order, as
    SGLang's children dict keeps insertion order) and emits a node's own requests after its
    children's (`_get_dfs_priority`), so requests with nothing cached come last.

    The tree is never materialized block by block. A node is the set of requests below it
    (its weight is the set's size): from a node, gallop down the requests' common path (chained
    hashes: equal hash at depth k means equal prefix through k) to the next branching point or
    the first request that ends, split there by next hash, and recurse with an explicit stack
    (paths can be thousands of blocks deep). A request alone in its set is emitted at once.
    Cost: O(requests x branch points on its path x log of the chains between them), never
    worse than one step per cached block; ~O(requests) when prompts share a few long prefixes.
    """
    paths: list[_Path] = []
    for rid in ids:
        hashes = block_hashes(rid)
        paths.append((rid, hashes, max(0, min(int(cached_blocks(rid)), len(hashes)))))
    order: list[str] = []
    # Work items: (requests below a node, depth they are known to share) or, as a marker that
    # the node's subtree is done, the node's own requests to emit.
    stack: list[tuple[list[_Path], int] | list[str]] = [(paths, 0)]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            order.extend(item)
            continue
        members, depth = item
        if len(members) == 1:
            order.append(members[0][0])
            continue
        depth = _common_depth(members, depth)
        own: list[str] = []
        children: dict[int, list[_Path]] = {}  # next block hash -> requests, first-seen order
        for path in members:
            if path[2] == depth:
                own.append(path[0])
            else:
                group = children.get(path[1][depth])
                if group is None:
                    children[path[1][depth]] = [path]
                else:
                    group.append(path)
        stack.append(own)
        kids = sorted(children.values(), key=lambda g: -len(g))  # stable: ties first-seen
        stack.extend((g, depth + 1) for g in reversed(kids))
    return order


def _common_depth(members: list[_Path], depth: int) -> int:
    """Deepest d >= depth that every member has cached and all share (same hash at d - 1),
    given that they share the first `depth` blocks. Gallops, then bisects."""
    limit = min(p[2] for p in members)
    first = members[0][1]

    def shared(d: int) -> bool:
        h = first[d - 1]
        return all(p[1][d - 1] == h for p in members)

    lo, step = depth, 1
    while True:
        probe = lo + step
        if probe > limit:
            hi = limit
            break
        if not shared(probe):
            hi = probe - 1
            break
        lo = probe
        step *= 2
    return deepest_true(hi, lambda i: shared(i + 1), lo)


class LOFPolicy(_PrecomputedOrder):
    """Longest output first: SGLang `_sort_by_longest_output` (stable, by -max_new_tokens).

    The order is a heap popped lazily, so a step that admits k requests costs O(n + k log n)
    instead of a full sort; the yielded sequence is exactly the stable sort's prefix.
    """

    name = "lof"

    def _compute(self, view: SchedulerView) -> Iterable[str]:
        heap = [(-view.request(rid).output_len, i, rid) for i, rid in enumerate(view.waiting_ids())]
        heapq.heapify(heap)
        return _pop_sorted(heap)


def _pop_sorted(heap: list[tuple[int, int, str]]) -> Iterator[str]:
    """Ids of a (key, tiebreak, id) heap in sorted order, popping only what is read."""
    while heap:
        yield heapq.heappop(heap)[2]


class RandomPolicy(_PrecomputedOrder):
    """SGLang `_sort_randomly` (random.shuffle of the queue), with its own seeded generator so
    a run is reproducible; `reset` re-seeds it."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = int(seed)
        self._rng = np.random.default_rng(self.seed)

    def _compute(self, view: SchedulerView) -> Iterable[str]:
        ids = list(view.waiting_ids())
        return [ids[i] for i in self._rng.permutation(len(ids))]

    def reset(self) -> None:
        super().reset()
        self._rng = np.random.default_rng(self.seed)
