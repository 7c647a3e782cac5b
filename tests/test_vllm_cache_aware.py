"""vllm-cache-aware: each point of vLLM 0.34's `_reorder_waiting_by_cached_prefix`, pinned on
hand-built queues (a FakeView whose cache hits, KV usage and request statuses the test sets),
then end to end through the real simulator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.workloads import SharedPrefixWorkload
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.registry import make_policy
from feather_sched.policies.vllm_cache_aware import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW,
    VllmCacheAwarePolicy,
)
from feather_sched.request import Request
from test_policies import FakeView, distinct, order
from test_policies import small_workloads as _small_workloads

COST = StepCostModel("h100-free-l2", "llama-3-8b")


class CacheView(FakeView):
    """FakeView plus the rule's inputs: KV usage and which requests are plain."""

    def __init__(self, usage: float = 1.0) -> None:
        super().__init__()
        self.kv_usage = usage
        self.not_plain: set[str] = set()

    def is_plain_waiting(self, request_id: str) -> bool:
        return request_id not in self.not_plain

    def queue(self, cached: dict[str, int]) -> None:
        for i, (rid, blocks) in enumerate(cached.items()):
            self.add(rid, distinct(i), cached=blocks)


def test_defaults_are_vllms_threshold_and_the_swept_window() -> None:
    policy = make_policy("vllm-cache-aware")
    assert (policy.threshold, policy.window) == (DEFAULT_THRESHOLD, DEFAULT_WINDOW) == (0.5, 256)


@pytest.mark.parametrize(
    "kwargs", [{"window": -1}, {"window": 1.5}, {"threshold": 1.01}, {"threshold": -0.1}]
)
def test_bad_options_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="vllm-cache-aware"):
        VllmCacheAwarePolicy(**kwargs)


def test_orders_by_cached_tokens_ties_by_position() -> None:
    view = CacheView()
    view.queue({"a": 0, "b": 2, "c": 0, "d": 5, "e": 2})
    assert order(VllmCacheAwarePolicy(), view) == ["d", "b", "e", "a", "c"]


@pytest.mark.parametrize("usage,moves", [(0.49, False), (0.5, True), (0.9, True)])
def test_applies_only_once_usage_reaches_the_threshold(usage: float, moves: bool) -> None:
    view = CacheView(usage)
    view.queue({"a": 0, "b": 3})
    assert order(VllmCacheAwarePolicy(), view) == (["b", "a"] if moves else ["a", "b"])


def test_threshold_zero_reorders_on_an_empty_cache_and_window_zero_never() -> None:
    view = CacheView(usage=0.0)
    view.queue({"a": 0, "b": 3})
    assert order(VllmCacheAwarePolicy(threshold=0.0), view) == ["b", "a"]
    assert order(VllmCacheAwarePolicy(window=0), CacheView(usage=1.0)) == []
    view = CacheView()
    view.queue({"a": 0, "b": 3})
    assert order(VllmCacheAwarePolicy(window=0), view) == ["a", "b"]


def test_only_the_window_moves_and_the_rest_keeps_its_order() -> None:
    view = CacheView()
    view.queue({"a": 0, "b": 1, "c": 0, "d": 9, "e": 9})
    # window 3: a, b, c reordered among themselves; d and e (cached most) stay behind.
    assert order(VllmCacheAwarePolicy(window=3), view) == ["b", "a", "c", "d", "e"]


def test_requests_that_are_not_plain_keep_their_slots() -> None:
    view = CacheView()
    view.queue({"p": 0, "a": 0, "q": 7, "b": 4})
    view.not_plain = {"p", "q"}  # preempted: vLLM's PREEMPTED status
    # plain slots 1 and 3 hold a, b: b moves to slot 1; p and q do not move nor count.
    assert order(VllmCacheAwarePolicy(), view) == ["p", "b", "q", "a"]


def test_fewer_than_two_plain_requests_change_nothing() -> None:
    view = CacheView()
    view.queue({"p": 0, "a": 3})
    view.not_plain = {"p"}
    policy = VllmCacheAwarePolicy()
    assert order(policy, view) == ["p", "a"]
    assert policy.reorders == 0


def test_the_reorder_persists_ties_follow_it_and_usage_falling_keeps_it() -> None:
    view = CacheView()
    view.queue({"a": 0, "b": 2})
    policy = VllmCacheAwarePolicy()
    assert order(policy, view) == ["b", "a"]
    view._cached.update(a=2)  # now tied: vLLM breaks ties by the queue's current position
    assert order(policy, view) == ["b", "a"]
    view.kv_usage = 0.1  # below the threshold: no reorder, the queue stays as vLLM left it
    view._cached.update(a=9)
    assert order(policy, view) == ["b", "a"]
    assert policy.reorders == 1


def test_arrivals_join_at_the_back_preempted_at_the_front() -> None:
    view = CacheView()
    view.queue({"a": 0, "b": 2})
    policy = VllmCacheAwarePolicy()
    assert order(policy, view) == ["b", "a"]
    view.kv_usage = 0.0
    view.add("new", distinct(7), cached=9)  # arrives: the host appends it
    view.add("back", distinct(8))  # preempted: the host puts it first
    view._waiting = {"back": None, **{k: None for k in view._waiting if k != "back"}}
    view.not_plain = {"back"}
    assert order(policy, view) == ["back", "b", "a", "new"]


def test_ids_that_stopped_waiting_are_skipped_and_reset_forgets() -> None:
    view = CacheView()
    view.queue({"a": 0, "b": 2, "c": 1})
    policy = VllmCacheAwarePolicy()
    policy.begin_step(view)
    got = policy.candidates(view)
    assert next(got) == "b"
    view.admit("c")
    assert list(got) == ["a"]
    policy.reset()
    assert policy.reorders == 0 and policy._queue == []


def test_idle_pass_reorders_as_vllm_does_before_its_loop() -> None:
    view = CacheView()
    view.queue({"a": 0, "b": 2})
    policy = VllmCacheAwarePolicy()
    policy.idle_pass(view)  # a step with no room to admit: vLLM reorders all the same
    view._cached.update(a=2, b=2)
    assert order(policy, view) == ["b", "a"]


# ---------------------------------------------------------------------------------- end to end
def test_moves_cached_requests_ahead_under_kv_pressure_and_beats_fcfs() -> None:
    """40 prefixes that do not all fit: the window admits requests whose prefix is resident
    first, as vLLM 0.34 does, and recomputes fewer prefixes than FCFS."""
    w = SharedPrefixWorkload(
        num_groups=40, prompts_per_group=10, system_prompt_len=1024, question_len=32, output_len=64
    )
    requests = w.generate(seed=0)
    config = EngineConfig(max_num_seqs=16, num_kv_blocks=1000, check_invariants_every=1)
    policy = VllmCacheAwarePolicy()
    ours = simulate(requests, policy, COST, config)
    fcfs = simulate(requests, make_policy("fcfs"), COST, config)
    assert policy.reorders > 0
    assert ours.summary()["output_tok_s"] > fcfs.summary()["output_tok_s"]
    off = simulate(requests, VllmCacheAwarePolicy(window=0), COST, config)
    assert off.summary()["output_tok_s"] == fcfs.summary()["output_tok_s"]  # never reorders


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=_small_workloads(),
    max_seqs=st.integers(1, 6),
    window=st.integers(0, 8),
    threshold=st.sampled_from([0.0, 0.3, 0.5, 1.0]),
    tokens=st.sampled_from([16, 64, 8192]),
)
def test_never_drops_nor_duplicates_a_request(
    data: tuple[list[Request], int], max_seqs: int, window: int, threshold: float, tokens: int
) -> None:
    """Small KV caches (preemptions), few slots and small token budgets (idle passes): every
    request finishes exactly once with its whole output."""
    requests, blocks = data
    config = EngineConfig(
        max_num_seqs=max_seqs,
        num_kv_blocks=blocks,
        max_num_batched_tokens=max(tokens, max_seqs),
        check_invariants_every=1,
    )
    policy = VllmCacheAwarePolicy(window=window, threshold=threshold)
    result = simulate(requests, policy, COST, config)
    got = [r.request_id for r in result.records]
    assert sorted(got) == sorted(r.request_id for r in requests)
    want = {r.request_id: r.output_len for r in requests}
    assert all(rec.output_len == want[rec.request_id] for rec in result.records)
    assert result.forced_admissions == 0
    assert np.all(result.steps["batch"] <= max_seqs)
