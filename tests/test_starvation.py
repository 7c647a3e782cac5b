"""The starvation guard: waits stay bounded, yet under a backlog the policy keeps the schedule."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather_sched import Request
from feather_sched.cost import StepCostModel
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.starvation import StarvationGuard
from feather_sched.sim.config import EngineConfig
from feather_sched.sim.engine import simulate

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
