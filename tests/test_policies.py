"""SGLang's policies and max-homogeneous: orders pinned on hand-built queues, then end to end.

The unit tests drive each policy through a FakeView: the SchedulerView protocol over a real
ChunkedHashTree, with block hashes and cached-block counts set by hand, so every order below
can be worked out on paper. The end-to-end tests run the real simulator.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.sim.kv_cache import block_hashes
from feather_lab.sim.result import TIMING_KEYS
from feather_lab.workloads import NoSharingWorkload, SharedPrefixWorkload
from feather_sched.cost.step_model import StepCostModel
from feather_sched.index.cht import ChunkedHashTree
from feather_sched.policies.base import Policy
from feather_sched.policies.homogeneous import MaxHomogeneousPolicy
from feather_sched.policies.registry import make_policy
from feather_sched.policies.sglang_baselines import (
    DFSWeightPolicy,
    LOFPolicy,
    LPMPolicy,
    RandomPolicy,
    dfs_weight_order,
)
from feather_sched.request import Request

MY_POLICIES = [
    "lpm",
    "dfs-weight",
    "hrrn",
    "shortest-prefill-first",
    "lof",
    "random",
    "max-homogeneous",
]


class FakeView:
    """SchedulerView over a real CHT; hashes and cache hits are whatever the test says."""

    def __init__(self, block_size: int = 16, chunk_size: int = 64, max_num_seqs: int = 256):
        self.index = ChunkedHashTree(chunk_size)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.now = 0.0
        self._reqs: dict[str, Request] = {}
        self._waiting: dict[str, None] = {}
        self._running: dict[str, None] = {}
        self._hashes: dict[str, list[int]] = {}
        self._cached: dict[str, int] = {}

    def add(
        self,
        rid: str,
        prompt: Sequence[int] | np.ndarray,
        *,
        output_len: int = 1,
        cached: int = 0,
        hashes: Sequence[int] | None = None,
    ) -> None:
        req = Request(rid, np.asarray(prompt, dtype=np.int32), output_len)
        self._reqs[rid] = req
        self._hashes[rid] = (
            list(hashes) if hashes is not None else block_hashes(req.prompt, self.block_size)
        )
        self._cached[rid] = cached
        self._waiting[rid] = None
        self.index.add(rid, req.prompt)

    def admit(self, rid: str) -> None:
        del self._waiting[rid]
        self._running[rid] = None
        self.index.admit(rid)

    def finish(self, rid: str) -> None:
        del self._running[rid]
        self.index.finish(rid)

    # SchedulerView
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def waiting_ids(self) -> Iterator[str]:
        return iter(self._waiting)

    def request(self, request_id: str) -> Request:
        return self._reqs[request_id]

    def arrival_time(self, request_id: str) -> float:
        return self._reqs[request_id].arrival_time

    def block_hashes(self, request_id: str) -> Sequence[int]:
        return self._hashes[request_id]

    def cached_blocks(self, request_id: str) -> int:
        return self._cached[request_id]


def order(policy: Policy, view: FakeView) -> list[str]:
    """One step's full candidate order (as the host would see it with unlimited budgets)."""
    policy.begin_step(view)
    return list(policy.candidates(view))


def distinct(i: int, n: int = 48) -> np.ndarray:
    """A prompt sharing no token with any other `distinct(j)`."""
    return np.arange(i * 10_000, i * 10_000 + n)


# ---------------------------------------------------------------------------------- lpm
def test_lpm_orders_by_cached_length_stably() -> None:
    view = FakeView()
    for rid, i, cached in [("a", 0, 0), ("b", 1, 3), ("c", 2, 1), ("d", 3, 3), ("e", 4, 2)]:
        view.add(rid, distinct(i, 80), cached=cached)
    # 48, 48, 32, 16, 0 cached tokens; ties keep queue order (b before d).
    assert order(LPMPolicy(), view) == ["b", "d", "e", "c", "a"]


@pytest.mark.parametrize("waiting, sorts", [(128, True), (129, False)])
def test_lpm_falls_back_to_queue_order_above_128_waiting(waiting: int, sorts: bool) -> None:
    view = FakeView(max_num_seqs=1000)
    ids = [f"r{i:03d}" for i in range(waiting)]
    for i, rid in enumerate(ids):
        view.add(rid, distinct(i, 64), cached=i % 4)  # later ones often cache more
    got = order(LPMPolicy(), view)
    if sorts:
        assert got == sorted(ids, key=lambda r: -(int(r[1:]) % 4))
    else:
        assert got == ids


def test_lpm_fallback_only_snapshots_what_fits() -> None:
    view = FakeView(max_num_seqs=8)
    for i in range(200):
        view.add(f"r{i:03d}", distinct(i, 16))
    assert order(LPMPolicy(), view) == [f"r{i:03d}" for i in range(8)]


def test_lpm_in_batch_prefix_caching_defers_second_sharer() -> None:
    shared = distinct(9, 64)
    view = FakeView()
    view.add("first", np.concatenate([shared, distinct(1, 16)]))  # nothing cached
    view.add("second", np.concatenate([shared, distinct(2, 16)]))  # shares 64 tokens: deferred
    view.add("warm", np.concatenate([shared, distinct(3, 16)]), cached=3)  # 48 > 32: not checked
    view.add("edge", np.concatenate([shared, distinct(4, 16)]), cached=2)  # 32 <= 32: checked
    view.add("other", distinct(5, 80))  # shares nothing
    policy = LPMPolicy()
    assert order(policy, view) == ["warm", "first", "other", "second", "edge"]
    assert policy.last_deprioritized == {"second", "edge"}


def test_lpm_in_batch_thresholds() -> None:
    base = distinct(7, 40)
    view = FakeView()
    view.add("a", base)
    view.add("b31", np.concatenate([base[:31], distinct(1, 9)]))  # in-batch match 31 < 32
    view.add("b32", np.concatenate([base[:32], distinct(2, 8)]))  # in-batch match 32 >= 32
    policy = LPMPolicy()
    assert order(policy, view) == ["a", "b31", "b32"]
    assert policy.last_deprioritized == {"b32"}
    # A negative check threshold disables in-batch caching (SGLang's -1).
    assert order(LPMPolicy(in_batch_check_threshold=-1), view) == ["a", "b31", "b32"]
    # A lower deprioritize threshold defers b31 too.
    policy = LPMPolicy(in_batch_deprioritize_threshold=16)
    assert order(policy, view) == ["a", "b31", "b32"]
    assert policy.last_deprioritized == {"b31", "b32"}


def test_lpm_skips_ids_that_stopped_waiting() -> None:
    view = FakeView()
    for rid, i, cached in [("a", 0, 0), ("b", 1, 2), ("c", 2, 1)]:
        view.add(rid, distinct(i, 64), cached=cached)
    policy = LPMPolicy()
    policy.begin_step(view)
    view.admit("c")  # e.g. taken by the host between begin_step and candidates
    assert list(policy.candidates(view)) == ["b", "a"]


# ---------------------------------------------------------------------------------- dfs-weight
#
#   root                       own: n1, n2 (nothing cached)          weight 10
#   ├── E (hash 5)                                                   weight 3
#   │   └── F (hash 6)         own: f1, f2, f3                       weight 3
#   └── A (hash 1)             own: a                                weight 5
#       ├── D (hash 4)         own: d                                weight 1
#       └── B (hash 2)         own: b1, b2                           weight 3
#           └── C (hash 3)     own: c                                weight 1
#
# Children are listed in first-seen order (queue order below). DFS: heaviest child first
# (A before E, B before D), a node's own requests after its children's, the root's last:
#   c, b1, b2, d, a, f1, f2, f3, n1, n2
DFS_QUEUE = [
    # rid, block hashes, cached blocks
    ("n1", [11, 12], 0),
    ("f1", [5, 6], 2),
    ("d", [1, 4, 13], 2),  # third block not cached: last node is D
    ("b1", [1, 2, 7], 2),
    ("c", [1, 2, 3], 3),
    ("f2", [5, 6], 2),
    ("a", [1], 1),
    ("b2", [1, 2], 2),
    ("f3", [5, 6, 8], 2),
    ("n2", [], 0),
]
DFS_EXPECTED = ["c", "b1", "b2", "d", "a", "f1", "f2", "f3", "n1", "n2"]


def test_dfs_weight_heaviest_subtree_first_children_before_parent() -> None:
    view = FakeView()
    for i, (rid, hashes, cached) in enumerate(DFS_QUEUE):
        view.add(rid, distinct(i, 16 * max(1, len(hashes))), hashes=hashes, cached=cached)
    assert order(DFSWeightPolicy(), view) == DFS_EXPECTED


def test_dfs_weight_ties_keep_first_seen_order_and_depth_is_part_of_identity() -> None:
    hashes = {"y": [20], "x": [10], "x2": [10], "y2": [20]}
    cached = dict.fromkeys(hashes, 1)
    assert dfs_weight_order(list(hashes), cached.__getitem__, hashes.__getitem__) == [
        "y",
        "y2",
        "x",
        "x2",
    ]
    # The same hash at another depth is another node: q and r sit at (0, 2), not under p's
    # (1, 2), so their subtree (weight 2) beats p's (weight 1).
    hashes = {"p": [1, 2], "q": [2], "r": [2]}
    cached = {"p": 2, "q": 1, "r": 1}
    got = dfs_weight_order(["p", "q", "r"], cached.__getitem__, hashes.__getitem__)
    assert got == ["q", "r", "p"]


def test_dfs_weight_handles_deep_paths() -> None:
    depth = 6000  # far past Python's recursion limit
    trunk = list(range(1, depth + 1))
    hashes = {
        "long": trunk,
        "branch": [*trunk[:3000], -1, -2],
        "mid": trunk[:3000],
        "leaf": trunk,
    }
    cached = {"long": depth, "branch": 3002, "mid": 3000, "leaf": depth}
    got = dfs_weight_order(["mid", "branch", "long", "leaf"], cached.__getitem__, hashes.get)
    # At depth 3000 (mid's node): trunk child weight 2 beats branch weight 1; mid last.
    assert got == ["long", "leaf", "branch", "mid"]


def _dfs_reference(ids, cached, hashes) -> list[str]:
    """SGLang's `_calc_weight` + `_get_dfs_priority` written naively: one node per cached
    prefix (a tuple of hashes), children in first-seen order, recursive."""
    children: dict[tuple, list[tuple]] = {(): []}
    own: dict[tuple, list[str]] = {(): []}
    for rid in ids:
        path = tuple(hashes[rid][: cached[rid]])
        for d in range(1, len(path) + 1):
            if path[:d] not in children:
                children[path[:d]] = []
                own[path[:d]] = []
                children[path[: d - 1]].append(path[:d])
        own[path].append(rid)

    def weight(node: tuple) -> int:
        return len(own[node]) + sum(weight(c) for c in children[node])

    out: list[str] = []

    def visit(node: tuple) -> None:
        for child in sorted(children[node], key=lambda c: -weight(c)):
            visit(child)
        out.extend(own[node])

    visit(())
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 2), max_size=5), st.integers(0, 5)),
        min_size=1,
        max_size=12,
    )
)
def test_dfs_weight_matches_naive_reference(reqs: list[tuple[list[int], int]]) -> None:
    # Symbols 0..2 per block; the chained "hash" of a block is its whole prefix.
    ids = [f"r{i}" for i in range(len(reqs))]
    hashes = {
        rid: [hash(tuple(sym[: d + 1])) for d in range(len(sym))]
        for rid, (sym, _) in zip(ids, reqs)
    }
    cached = {rid: min(c, len(sym)) for rid, (sym, c) in zip(ids, reqs)}
    got = dfs_weight_order(ids, cached.__getitem__, hashes.__getitem__)
    assert got == _dfs_reference(ids, cached, hashes)


# ---------------------------------------------------------------------------------- lof, random
def test_lof_longest_output_first_stable() -> None:
    view = FakeView()
    for i, (rid, out) in enumerate([("a", 3), ("b", 8), ("c", 3), ("d", 5), ("e", 8)]):
        view.add(rid, distinct(i, 16), output_len=out)
    assert order(LOFPolicy(), view) == ["b", "e", "d", "a", "c"]


def test_random_is_deterministic_per_seed_and_reseeds_on_reset() -> None:
    view = FakeView()
    ids = [f"r{i:02d}" for i in range(20)]
    for i, rid in enumerate(ids):
        view.add(rid, distinct(i, 16))
    p0 = RandomPolicy(seed=0)
    first = order(p0, view)
    assert sorted(first) == ids and first != ids
    second = order(p0, view)  # the generator moved on
    assert second != first
    assert order(RandomPolicy(seed=0), view) == first
    assert order(RandomPolicy(seed=1), view) != first
    p0.reset()
    assert order(p0, view) == first


# ---------------------------------------------------------------------------------- max-homog.
def homog_view() -> FakeView:
    """Chunk size 4. Group A prompts share 8 tokens; a0 and a2 share 12. B prompts share 4."""
    view = FakeView(chunk_size=4)
    a = np.arange(100, 112)
    b = np.arange(200, 204)
    view.add("a0", np.concatenate([a, [1, 1]]))
    view.add("b0", np.concatenate([b, [2, 2, 2, 2]]))
    view.add("a1", np.concatenate([a[:8], [3, 3, 3, 3]]))
    view.add("a2", np.concatenate([a, [4, 4]]))
    view.add("b1", np.concatenate([b, [5, 5, 5, 5]]))
    view.add("x", [9])  # shorter than a chunk, shares nothing
    return view


def step(policy: Policy, view: FakeView) -> list[str]:
    """Admit every candidate (unlimited budgets), as the host would."""
    policy.begin_step(view)
    admitted = []
    for rid in policy.candidates(view):
        if policy.accept(view, rid):
            view.admit(rid)
            admitted.append(rid)
    return admitted


def test_max_homogeneous_serves_oldest_group_and_switches_after_drain() -> None:
    view = homog_view()
    policy = MaxHomogeneousPolicy()
    # Oldest is a0; deepest depth with >= 2 waiting is 3 chunks (a0, a2), not 2 (a0, a1, a2).
    assert step(policy, view) == ["a0", "a2"]
    assert policy.current_group == view.index.keys_of("a0")[2]
    assert step(policy, view) == []  # batch still running, group empty: admit nothing
    view.add("a3", np.concatenate([np.arange(100, 112), [7]]))  # a late member joins
    assert step(policy, view) == ["a3"]
    for rid in ["a0", "a2"]:
        view.finish(rid)
    assert step(policy, view) == []  # a3 still runs
    view.finish("a3")
    # Drained: the oldest waiting is b0; its group is b0, b1 (a1 is not served yet).
    assert step(policy, view) == ["b0", "b1"]
    view.finish("b0")
    view.finish("b1")
    assert step(policy, view) == ["a1"]  # alone now: a group of one
    assert policy.current_group == "a1"
    view.finish("a1")
    assert step(policy, view) == ["x"]  # shorter than a chunk, no partner
    view.finish("x")
    assert step(policy, view) == []  # empty queue and index
    assert view.index.is_empty()


def test_max_homogeneous_identical_short_prompts_and_empty_prompt() -> None:
    view = FakeView(chunk_size=4)
    view.add("e", [])
    view.add("s1", [5, 6])
    view.add("s2", [5, 6])
    policy = MaxHomogeneousPolicy()
    assert step(policy, view) == ["e"]
    view.finish("e")
    assert step(policy, view) == ["s1", "s2"]  # same partial chunk: a group of two
    policy.reset()
    assert policy.current_group is None


# ---------------------------------------------------------------------------------- end to end
COST = StepCostModel("h100-free-l2", "llama-3-8b")
CONFIG = EngineConfig(max_num_seqs=16)
SHARED = SharedPrefixWorkload(
    num_groups=4, prompts_per_group=8, system_prompt_len=256, question_len=32, output_len=16
)
NO_SHARING = NoSharingWorkload(num_requests=32, prompt_len=128, output_len=8)


def _summary(result) -> dict:
    return {k: v for k, v in result.summary().items() if k not in TIMING_KEYS}


@pytest.mark.parametrize("name", MY_POLICIES)
@pytest.mark.parametrize("workload", [SHARED, NO_SHARING], ids=["shared", "no-sharing"])
def test_end_to_end_completes_and_is_deterministic(name: str, workload) -> None:
    requests = workload.generate(seed=3)
    first = simulate(requests, make_policy(name), COST, CONFIG)
    assert sorted(r.request_id for r in first.records) == sorted(r.request_id for r in requests)
    want = {r.request_id: r.output_len for r in requests}
    assert all(rec.output_len == want[rec.request_id] for rec in first.records)
    assert first.forced_admissions == 0
    again = simulate(requests, make_policy(name), COST, CONFIG)
    assert _summary(again) == _summary(first)
    assert [r.request_id for r in again.records] == [r.request_id for r in first.records]


@pytest.mark.parametrize("name", MY_POLICIES)
def test_small_kv_preempts_and_still_completes(name: str) -> None:
    workload = SharedPrefixWorkload(
        num_groups=2, prompts_per_group=6, system_prompt_len=128, question_len=16, output_len=8
    )
    requests = workload.generate(seed=0)
    config = EngineConfig(max_num_seqs=16, num_kv_blocks=12, check_invariants_every=1)
    result = simulate(requests, make_policy(name), COST, config)
    assert result.preemptions > 0
    assert len(result.records) == len(requests)


def test_max_homogeneous_batches_are_single_group() -> None:
    result = simulate(SHARED.generate(seed=1), MaxHomogeneousPolicy(), COST, CONFIG)
    assert result.steps["groups"].max() == 1
    result = simulate(NO_SHARING.generate(seed=1), MaxHomogeneousPolicy(), COST, CONFIG)
    assert result.steps["batch"].max() == 1  # over-homogenized: one request at a time


def test_random_policy_seed_changes_schedule() -> None:
    requests = NO_SHARING.generate(seed=0)
    config = EngineConfig(max_num_seqs=4)
    a = simulate(requests, make_policy("random", seed=0), COST, config)
    b = simulate(requests, make_policy("random", seed=1), COST, config)
    assert [r.request_id for r in a.records] != [r.request_id for r in b.records]


_BASES = [np.random.default_rng(100 + i).integers(0, 1000, 96).astype(np.int32) for i in range(3)]


@st.composite
def small_workloads(draw) -> tuple[list[Request], int]:
    n = draw(st.integers(1, 20))
    reqs = []
    for i in range(n):
        base = draw(st.integers(0, len(_BASES)))  # == len: no shared prefix
        cut = draw(st.integers(0, 80))
        tail = draw(st.lists(st.integers(0, 999), min_size=0 if cut else 1, max_size=16))
        head = _BASES[base][:cut] if base < len(_BASES) else np.array([], dtype=np.int32)
        prompt = np.concatenate([head, np.array(tail, dtype=np.int32)])
        reqs.append(
            Request(
                f"q{i:02d}",
                prompt,
                draw(st.integers(1, 8)),
                arrival_time=draw(st.just(0.0) | st.floats(0, 0.01, allow_nan=False)),
            )
        )
    longest = max(r.prompt_len + r.output_len for r in reqs)
    blocks = -(-longest // 16) + draw(st.integers(0, 3))
    return reqs, blocks


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=small_workloads(), max_seqs=st.integers(1, 6))
def test_random_small_workloads_complete_under_every_policy(
    data: tuple[list[Request], int], max_seqs: int
) -> None:
    requests, blocks = data
    config = EngineConfig(max_num_seqs=max_seqs, num_kv_blocks=blocks, check_invariants_every=1)
    ids = sorted(r.request_id for r in requests)
    for name in MY_POLICIES:
        result = simulate(requests, make_policy(name), COST, config)
        got = [r.request_id for r in result.records]
        assert sorted(got) == ids, name


def _queue_order_checked(base: type[Policy]) -> type[Policy]:
    """`base`, asserting that on every step where it claims `follows_queue_order` its own
    candidates are the queue in order and every one is ADDed (what a host that skips it
    would do instead)."""

    class Checked(base):  # type: ignore[valid-type, misc]
        claimed_steps = 0
        steps = 0

        def candidates(self, view):
            self.steps += 1
            self._claimed = self.follows_queue_order(view)
            expected = list(view.waiting_ids()) if self._claimed else []
            self.claimed_steps += self._claimed
            for i, rid in enumerate(super().candidates(view)):
                if self._claimed:
                    assert rid == expected[i], "claimed queue order, yielded another"
                yield rid

        def accept(self, view, request_id):
            ok = super().accept(view, request_id)
            assert ok or not self._claimed, "claimed queue order, then said STOP"
            return ok

    return Checked


@pytest.mark.parametrize("name", ["feather", "grouped", "fcfs"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 40), st.floats(0, 0.05)),
        min_size=1,
        max_size=30,
    )
)
def test_follows_queue_order_is_truthful(name: str, shapes) -> None:
    """Prompts from 6 prefixes (0 = unique), arriving over time: steps with and without
    sharing; wherever a policy claims queue order, its own choices are queue order."""
    reqs = []
    for i, (prefix, length, arrival) in enumerate(shapes):
        head = [1000 + i] if prefix == 0 else [prefix] * 8
        prompt = np.array(head + [2000 + i] * length, dtype=np.int32)
        reqs.append(Request(f"r{i}", prompt, 3, arrival_time=arrival))
    policy = _queue_order_checked(type(make_policy(name)))()
    cfg = EngineConfig(max_num_seqs=4, block_size=4, index_chunk_size=4, max_num_batched_tokens=64)
    result = simulate(reqs, policy, COST, cfg)
    assert len(result.records) == len(reqs)


def test_follows_queue_order_claims_only_without_sharing() -> None:
    policy = _queue_order_checked(type(make_policy("feather")))()
    cfg = EngineConfig(max_num_seqs=8)
    simulate(
        NoSharingWorkload(num_requests=30, prompt_len=200, output_len=4).generate(0),
        policy,
        COST,
        cfg,
    )
    assert policy.claimed_steps == policy.steps > 0
    policy = _queue_order_checked(type(make_policy("feather")))()
    reqs = SharedPrefixWorkload(num_groups=2, prompts_per_group=8).generate(0)
    simulate(reqs, policy, COST, cfg)
    assert policy.claimed_steps < policy.steps


# --------------------------------------------------------------------------------- hrrn
def test_hrrn_orders_by_response_ratio_then_id() -> None:
    from feather_sched.policies.sglang_baselines import HRRNPolicy

    view = FakeView()
    policy = HRRNPolicy()
    view.add("old-long", distinct(0, 160))  # 160 uncached
    view.add("old-short", distinct(1, 32))  # 32 uncached
    policy.begin_step(view)  # both enter at counter 0
    policy.end_step(view, 0.1, 1, prefill_tokens=320)
    view.add("new", distinct(2, 16))  # enters at 320: waited 0
    view.add("cached", distinct(3, 48), cached=3)  # nothing left to prefill: first
    # ratios: old-short 320/32 = 10, old-long 320/160 = 2, new 0, cached -> -inf key
    assert order(policy, view) == ["cached", "old-short", "old-long", "new"]
    # equal ratios: request id order, as SGLang's (-ratio, rid) key
    view2 = FakeView()
    for rid, i in [("b", 0), ("a", 1)]:
        view2.add(rid, distinct(i, 32))
    assert order(HRRNPolicy(), view2) == ["a", "b"]


def test_hrrn_defers_in_batch_sharers_and_falls_back_above_128() -> None:
    from feather_sched.policies.sglang_baselines import HRRNPolicy

    shared = distinct(9, 64)
    view = FakeView()
    view.add("z-first", np.concatenate([shared, distinct(1, 16)]))
    view.add("a-second", np.concatenate([shared, distinct(2, 16)]))  # deferred despite its id
    assert order(HRRNPolicy(), view) == ["z-first", "a-second"]
    big = FakeView(max_num_seqs=1000)
    ids = [f"r{i:03d}" for i in reversed(range(129))]
    for i, rid in enumerate(ids):
        big.add(rid, distinct(i, 16))
    assert order(HRRNPolicy(), big) == ids  # queue order, not id order


def test_hrrn_reentry_resnapshots_and_reset_clears() -> None:
    from feather_sched.policies.sglang_baselines import HRRNPolicy

    view = FakeView()
    policy = HRRNPolicy()
    view.add("a", distinct(0, 32))
    policy.begin_step(view)
    policy.end_step(view, 0.1, 1, prefill_tokens=100)
    view.admit("a")
    policy.begin_step(view)  # "a" left the queue: forgotten
    assert "a" not in policy._entered
    policy.reset()
    assert policy.processed_tokens == 0


@pytest.mark.sglang
def test_hrrn_matches_sglang_sort() -> None:
    """The same queue through SGLang 0.5.23's own `_sort_by_hrrn` (when SGLang is here)."""
    from types import SimpleNamespace

    from feather_sched.policies.sglang_baselines import HRRNPolicy
    from feather_sched.sglang.cpu import prepare_cpu_import

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed (see the 'sglang' extra in pyproject.toml)")
    prepare_cpu_import()
    sp = importlib.import_module("sglang.srt.managers.schedule_policy")
    rng = np.random.default_rng(3)
    view = FakeView()
    policy = HRRNPolicy(in_batch_check_threshold=-1)
    entered = {}
    for k in range(12):
        rid = f"q{rng.integers(1000):03d}-{k}"
        view.add(rid, distinct(k, int(rng.integers(1, 10)) * 16), cached=int(rng.integers(0, 3)))
        entered[rid] = policy.processed_tokens
        policy.begin_step(view)
        policy.end_step(view, 0.1, 1, prefill_tokens=int(rng.integers(0, 500)))
    ours = order(policy, view)
    reqs = [
        SimpleNamespace(
            rid=rid,
            origin_input_ids=list(view.request(rid).prompt),
            num_matched_prefix_tokens=view.cached_blocks(rid) * view.block_size,
            arrival_processed_tokens=entered[rid],
        )
        for rid in view.waiting_ids()
    ]
    sp.SchedulePolicy._sort_by_hrrn(reqs, set(), policy.processed_tokens)
    assert ours == [r.rid for r in reqs]


# --------------------------------------------------------------------- shortest-prefill-first
def test_shortest_prefill_first_order_and_no_fallback() -> None:
    from feather_sched.policies.sglang_baselines import ShortestPrefillFirstPolicy

    view = FakeView()
    view.add("long", distinct(0, 160))  # 160 uncached
    view.add("short", distinct(1, 32))  # 32
    view.add("warm", distinct(2, 160), cached=9)  # 160 - 144 = 16
    view.add("tie", distinct(3, 32))  # 32, entered with "short": queue order kept
    assert order(ShortestPrefillFirstPolicy(), view) == ["warm", "short", "tie", "long"]
    big = FakeView(max_num_seqs=1000)
    for i in range(130):
        big.add(f"r{i:03d}", distinct(i, 16 * (130 - i)))
    got = order(ShortestPrefillFirstPolicy(), big)
    assert got[0] == "r129"  # still sorted above 128 waiting


@pytest.mark.sglang
def test_shortest_prefill_first_matches_sglang_sort() -> None:
    from types import SimpleNamespace

    from feather_sched.policies.sglang_baselines import ShortestPrefillFirstPolicy
    from feather_sched.sglang.cpu import prepare_cpu_import

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed (see the 'sglang' extra in pyproject.toml)")
    prepare_cpu_import()
    sp = importlib.import_module("sglang.srt.managers.schedule_policy")
    rng = np.random.default_rng(5)
    view = FakeView()
    for k in range(14):
        prompt = distinct(k, int(rng.integers(1, 8)) * 16)
        view.add(f"q{k:02d}", prompt, cached=int(rng.integers(0, 3)))
    ours = order(ShortestPrefillFirstPolicy(in_batch_check_threshold=-1), view)
    reqs = [
        SimpleNamespace(
            rid=rid,
            origin_input_ids=list(view.request(rid).prompt),
            output_ids=[],
            num_matched_prefix_tokens=view.cached_blocks(rid) * view.block_size,
            time_stats=SimpleNamespace(wait_queue_entry_time=view.arrival_time(rid)),
        )
        for rid in view.waiting_ids()
    ]
    sp.SchedulePolicy._sort_by_shortest_prefill(reqs, set())
    assert ours == [r.rid for r in reqs]


@settings(max_examples=200, deadline=None)
@given(
    waiting=st.integers(0, 120),
    cap=st.integers(1, 80),
    admits=st.lists(st.booleans(), max_size=120),
)
def test_the_queue_head_read_in_batches_is_one_snapshot_of_the_queue(
    waiting: int, cap: int, admits: list[bool]
) -> None:
    """`queue_head` reads the queue in growing batches, yet yields what one snapshot of its
    first `max_num_seqs` ids taken at the first candidate would, while the host admits some
    of the yielded ids (they leave its queue) and leaves others waiting."""
    from feather_sched.policies.fcfs import queue_head

    view = FakeView(max_num_seqs=cap)
    for i in range(waiting):
        view.add(f"r{i}", [i, i + 1])
    snapshot = list(view.waiting_ids())[:cap]
    got = []
    for rid, admit in zip(queue_head(view), [*admits, *[True] * waiting], strict=False):
        got.append(rid)
        if admit:
            view.admit(rid)
    assert got == snapshot
