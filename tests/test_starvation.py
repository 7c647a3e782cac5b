"""The starvation guard: waits stay bounded, yet under a backlog the policy keeps the schedule."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_sched import Request
from feather_sched.cost import StepCostModel
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.registry import make_policy
from feather_sched.policies.starvation import StarvationGuard

COST = StepCostModel("h100-free-l2", "llama-3-8b")


class _Queue:
    """The part of a SchedulerView the guard reads: a clock and an age-ordered queue. Counts
    how many queue entries the guard looks at."""

    def __init__(self, arrivals: list[float]) -> None:
        self.now = 0.0
        self.queue = {f"r{i}": t for i, t in enumerate(arrivals)}
        self.looked = 0

    def waiting_ids(self) -> Iterator[str]:
        for rid in self.queue:
            self.looked += 1
            yield rid

    def arrival_time(self, rid: str) -> float:
        return self.queue[rid]


@settings(max_examples=60, deadline=None)
@given(
    share=st.sampled_from([0.1, 0.25, 0.5]),
    steps=st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=80),
)
def test_forced_share_is_bounded_and_the_head_only_is_read(share, steps) -> None:
    """Whatever the policy admits, forced admissions stay within `share` of its own (plus
    the first credit), and each step reads one queue entry, whatever the queue length."""
    view = _Queue([0.0] * 500)  # a standing backlog: everything is over-age
    guard = StarvationGuard(max_wait_s=1.0, share=share, wait_factor=0.0)
    own = 0
    for adds, head_fits in steps:
        view.now += 10.0
        view.looked = 0
        forced = guard.pick(view)
        assert view.looked <= 1
        if forced is not None:
            guard.admitted(view, forced, forced=True)
            if head_fits:
                del view.queue[forced]
        for rid in list(view.queue)[-adds:] if adds else []:
            guard.admitted(view, rid, forced=False)
            del view.queue[rid]
            own += 1
    assert guard.forced <= 1 + share * own + 1e-9


def test_a_head_that_does_not_fit_stays_first_without_new_credit() -> None:
    view = _Queue([0.0, 0.0, 0.0])
    guard = StarvationGuard(max_wait_s=1.0, share=0.5, wait_factor=0.0)
    view.now = 5.0
    head = guard.pick(view)
    guard.admitted(view, head, forced=True)  # the host could not fit it
    assert guard.credit == 0 and guard.pick(view) == head  # still first, no credit needed
    guard.admitted(view, head, forced=True)
    assert guard.forced == 1 and guard.credit == 0


def test_over_age_is_relative_to_the_recent_waits() -> None:
    view = _Queue([0.0])
    guard = StarvationGuard(max_wait_s=1.0, wait_factor=2.0)
    guard.mean_wait = 50.0  # admissions have recently waited 50 s on average
    view.now = 60.0
    assert guard.pick(view) is None  # 60 s is usual under this load
    view.now = 101.0
    assert guard.pick(view) == "r0"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_wait_s": 0}, "max_wait_s"), ({"share": 0}, "share"), ({"wait_factor": -1}, "wait")],
)
def test_bad_options_are_refused(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        StarvationGuard(**kwargs)


def test_backlog_keeps_the_policy_in_charge() -> None:
    """Every request arrives at once and the engine needs minutes to serve them: all are
    over-age long before the end. Forced admissions stay a bounded share, every request is
    served once, and the row's forced_admissions is the true count."""
    rng = np.random.default_rng(3)
    prefixes = [rng.integers(0, 30_000, 4096) for _ in range(8)]
    reqs = [
        Request(f"q{i}", np.r_[prefixes[i % 8], rng.integers(0, 30_000, 64)], 64)
        for i in range(800)
    ]
    policy = FeatherPolicy(max_wait_s=0.5, starvation_share=0.25, wait_factor=0.0)
    result = simulate(reqs, policy, COST, EngineConfig(max_num_seqs=32, num_kv_blocks=4000))
    row = result.summary()
    assert row["requests"] == len(reqs)
    assert max(r.ttft for r in result.records) > 0.5  # the guard had work to do
    assert 0 < policy.starvation_admits <= 1 + 0.25 * len(reqs)
    assert row["forced_admissions"] >= row["starvation_admits"] == policy.starvation_admits


# ------------------------------------------------------------ continuous arrivals: the bound


def _stream(seed: int, rate: float, n: int, loners: int, groups: int) -> list[Request]:
    """Poisson arrivals at `rate` req/s, mostly of one hot prefix group (the rest of
    `groups` others), plus `loners` requests sharing nothing, arriving in the first half:
    the requests a prefix order keeps putting last while the hot group keeps coming."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 30_000, 1024) for _ in range(groups)]
    times = np.cumsum(rng.exponential(1 / rate, n))
    reqs = []
    for i in range(n):
        prefix = prefixes[int(rng.integers(groups)) if rng.random() < 0.3 else 0]
        prompt = np.r_[prefix, rng.integers(0, 30_000, 16)]
        reqs.append(Request(f"g{i:04d}", prompt, int(rng.integers(16, 96)), float(times[i])))
    for j, at in enumerate(rng.uniform(0, times[-1] / 2, loners)):
        reqs.append(Request(f"l{j}", rng.integers(0, 30_000, int(rng.integers(64, 1024))), 64, at))
    return reqs


def _max_wait(reqs: list[Request], policy, max_num_seqs: int) -> float:
    """The longest wait to a first token of the run."""
    engine = EngineConfig(max_num_seqs=max_num_seqs, num_kv_blocks=3000)
    return max(r.ttft for r in simulate(reqs, policy, COST, engine).records)


def wait_bound(max_wait_s: float, share: float, wait_factor: float, fcfs_wait: float) -> float:
    """What the guard promises: a request is over-age after max(max_wait_s, wait_factor x
    the mean wait) <= max_wait_s + wait_factor x FCFS's longest wait; from then on the
    over-age requests move, in age order, at one admission per ceil(1 / share) of the
    policy's own, i.e. no slower than FCFS's queue divided by that."""
    return max_wait_s + (wait_factor + math.ceil(1 / share)) * fcfs_wait


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    rate=st.floats(10, 150),
    max_wait_s=st.sampled_from([0.5, 2.0]),
    share=st.sampled_from([0.1, 0.25, 0.5]),
    wait_factor=st.sampled_from([0.0, 1.0]),
    groups=st.integers(1, 3),
    max_num_seqs=st.sampled_from([8, 32]),
)
def test_the_oldest_wait_is_bounded_under_continuous_arrivals(
    seed, rate, max_wait_s, share, wait_factor, groups, max_num_seqs
) -> None:
    """Under load from light to overloaded, no request waits longer under feather than the
    guard's bound over FCFS's longest wait on the same arrivals."""
    reqs = _stream(seed, rate, 200, 4, groups)
    fcfs = _max_wait(reqs, make_policy("fcfs"), max_num_seqs)
    policy = FeatherPolicy(max_wait_s=max_wait_s, starvation_share=share, wait_factor=wait_factor)
    assert _max_wait(reqs, policy, max_num_seqs) <= wait_bound(max_wait_s, share, wait_factor, fcfs)


def test_without_the_guard_the_bound_fails() -> None:
    """The bound has teeth: with the guard effectively off, requests of no group wait while
    the hot group keeps arriving (most of the run); with it they wait what FCFS waits."""
    reqs = _stream(0, 30.0, 600, 2, 1)  # the hot group keeps 8 slots busy for 20 s
    fcfs = _max_wait(reqs, make_policy("fcfs"), 8)  # 3.1 s
    bound = wait_bound(1.0, 0.25, 0.0, fcfs)  # 13.2 s
    guarded = FeatherPolicy(max_wait_s=1.0, starvation_share=0.25, wait_factor=0.0)
    assert _max_wait(reqs, guarded, 8) <= bound  # 3.1 s
    assert _max_wait(reqs, FeatherPolicy(max_wait_s=1e9), 8) > bound  # 21.4 s
