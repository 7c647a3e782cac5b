"""The router's drain forecast: bookings undo exactly, and it prices the paper's effect."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather_lab.bench.cluster import ClusterBenchSpec, run_cluster_bench
from feather_lab.bench.suite import BenchSpec
from feather_lab.sim.cluster import simulate_cluster
from feather_lab.sim.config import EngineConfig
from feather_lab.workloads.presets import PAPER_SHAPE
from feather_lab.workloads.registry import make_workload
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.registry import make_policy
from feather_sched.routing.forecast import Booking, DrainModel, ReplicaForecast
from feather_sched.routing.rules import make_rule

COST = StepCostModel("h100-free-l2", "llama-3.1-8b", "paged")
bookings = st.builds(
    Booking,
    group=st.one_of(st.none(), st.integers(0, 3)),
    uncached=st.integers(1, 4000),
    prompt=st.integers(1, 8000),
    output=st.floats(1, 500),
    shared=st.integers(0, 4000),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(bookings, max_size=30), st.randoms(use_true_random=False))
def test_released_bookings_leave_nothing_behind(items, rnd):
    f = ReplicaForecast()
    for b in items:
        f.add(b)
    assert f.requests == len(items)
    assert f.shared_unique <= f.shared_logical
    rnd.shuffle(items)
    for b in items:
        f.add(b, -1)
    assert (f.requests, f.uncached, f.prompt, f.groups) == (0, 0, 0, {})
    assert (f.shared_unique, f.shared_logical) == (0, 0)
    assert f.output == pytest.approx(0.0, abs=1e-6)
    assert DrainModel(COST, 256).drain_s(f) == pytest.approx(0.0, abs=1e-9)


def _replica(group_sizes: list[int], prefix: int = 8192, suffix: int = 32) -> ReplicaForecast:
    f = ReplicaForecast()
    for g, n in enumerate(group_sizes):
        for i in range(n):
            f.add(Booking(g, suffix if i else prefix + suffix, prefix + suffix, 64.0, prefix))
    return f


def test_a_request_costs_less_beside_its_group_than_beside_another():
    model = DrainModel(COST, 256)
    holder, other = _replica([32]), _replica([0, 32])
    join = Booking(0, 32, 8192 + 32, 64.0, 8192)  # its prefix is there
    fresh = Booking(0, 8192 + 32, 8192 + 32, 64.0, 0)  # its prefix is not
    added_holder = model.drain_s(holder, join) - model.drain_s(holder)
    added_other = model.drain_s(other, fresh) - model.drain_s(other)
    assert added_holder < added_other / 10
    # and a homogeneous batch drains faster than the same requests in two groups
    assert model.drain_s(_replica([64])) < model.drain_s(_replica([32, 32]))


def test_priced_spills_keep_few_long_groups_whole():
    """5 groups of 10,000-token prefixes on 8 replicas: a load bound alone split them into
    pieces that paired up (0.62x Ray's prefix router, benchmarks/cluster/cluster.md)."""
    spec = ClusterBenchSpec(
        base=BenchSpec(workloads=("long-prefix",)),
        replicas=8,
        routers=("prefix-affinity", "feather"),
    )
    pa, feather = run_cluster_bench(spec)
    assert feather["output_tok_s"] >= 0.97 * pa["output_tok_s"]
    assert feather["mean_prefix_groups"] <= 1.1


def test_keeps_up_until_the_batch_its_rate_needs_outgrows_max_num_seqs():
    model = DrainModel(COST, 256)
    one = _replica([64])  # one 8k-token prefix: fits the cache
    two = _replica([32, 32])  # two: do not (the H100 profile caches ~11.5k tokens a layer)
    assert model.keeps_up(one, 10.0, 32) and not model.keeps_up(one, 1e6, 32)
    rates = [r for r in range(50, 5000, 50) if model.keeps_up(one, r, 32)]
    assert rates == list(range(50, rates[-1] + 1, 50))  # a threshold, not noise
    # the same requests in two groups that overflow the cache serve fewer arrivals
    assert model.keeps_up(one, rates[-1], 32) and not model.keeps_up(two, rates[-1], 32)
    # and prefill to compute with every arrival lowers the rate it keeps up with
    assert not model.keeps_up(one, rates[-1], 4096)


def test_a_group_too_many_for_the_replicas_pairs_where_its_prefix_fits():
    """5 groups of 5,000-10,000-token prefixes, Poisson arrivals, 4 replicas (the paper's
    scenario, seed 1): the fifth group must share a replica. Placed by the count bound alone
    it went beside a prefix it overflowed the cache with, and the spills that followed split
    groups (0.50x Ray's prefix router, which pairs it beside the shortest prefix)."""
    spec = ClusterBenchSpec(
        base=BenchSpec(workloads=("paper-5g",), seed=1),
        replicas=4,
        routers=("prefix-affinity", "feather"),
    )
    pa, feather = run_cluster_bench(spec)
    assert feather["output_tok_s"] >= 0.97 * pa["output_tok_s"]


def test_a_booked_copy_leaves_the_original_alone():
    f = _replica([3, 2])
    before = (f.requests, f.uncached, f.shared_unique, f.shared_logical, len(f.groups))
    g = f.plus(Booking(7, 100, 8224, 64.0, 8192))  # a spill: its group runs elsewhere
    assert (f.requests, f.uncached, f.shared_unique, f.shared_logical, len(f.groups)) == before
    assert g.requests == f.requests + 1 and g.members_of(7) == 1
    assert g.shared_unique == f.shared_unique + 8192  # its prefix joins the working set


def test_a_hot_group_stays_whole_where_it_keeps_up():
    """60% of the arrivals in one group, the rest in 10 small ones, 4 replicas (no replica
    is ever idle): the hot group's holder keeps up, so it is not split onto busy replicas;
    Ray's prefix router piles small groups onto it too, pow2 mixes everything."""
    shape = {**PAPER_SHAPE}
    hot = make_workload(
        "long-prefix",
        num_prefixes=1,
        requests_per_prefix=600,
        **{**shape, "arrival": "poisson:600"},
    ).generate(11)
    rest = make_workload(
        "long-prefix",
        num_prefixes=10,
        requests_per_prefix=40,
        **{**shape, "arrival": "poisson:400"},
    ).generate(12)
    reqs = [dataclasses.replace(r, request_id=f"h{r.request_id}") for r in hot]
    reqs += [dataclasses.replace(r, request_id=f"s{r.request_id}") for r in rest]
    engine = EngineConfig(max_num_seqs=500)
    tok = {}
    for router in ("pow2", "prefix-affinity", "feather"):
        kw = {"cost": COST, "max_num_seqs": 500} if router == "feather" else {}
        policy = "feather" if router == "feather" else "fcfs"
        res = simulate_cluster(
            reqs, make_rule(router, **kw), lambda p=policy: make_policy(p), COST, engine, 4
        )
        tok[router] = res.summary()["output_tok_s"]
    assert tok["feather"] >= 1.5 * max(tok["pow2"], tok["prefix-affinity"])


@pytest.mark.parametrize(
    ("workload", "replicas", "seed", "baseline", "why"),
    [
        # the second home went to the shortest queue, a replica running the two longest
        # prefixes, which then set the makespan (0.86x): it is now the cheapest by forecast
        ("paper-20g", 8, 2, "prefix-affinity", "second home by forecast"),
        # the group, split once, was split again onto a third replica while its first
        # second home still kept up (0.94x): a holder that keeps up keeps it
        ("paper-5g", 4, 2, "prefix-affinity", "any holder that keeps up"),
        # the last 20 requests of the one group went to a cold idle replica at the end of
        # the burst and paid its whole prefix prefill (0.85x pow2): a holder finishes sooner
        ("paper-1g", 8, 3, "pow2", "a late spill stays warm"),
    ],
)
def test_rows_that_lost_to_a_ray_router_on_other_seeds(workload, replicas, seed, baseline, why):
    """Rows of benchmarks/cluster/cluster_grid.py where an earlier rule lost to a Ray router."""
    spec = ClusterBenchSpec(
        # the grid was recorded on the free-L2 H100 (the default before the measured H200)
        base=BenchSpec(workloads=(workload,), seed=seed, hardware="h100-free-l2"),
        replicas=replicas,
        routers=(baseline, "feather"),
    )
    ray, feather = run_cluster_bench(spec)
    assert feather["output_tok_s"] >= 0.97 * ray["output_tok_s"], why


def _h200_against_prefix_affinity(workload: str, seed: int) -> tuple[dict, dict]:
    """Ray's prefix router's row and Feather's, 4 replicas on the measured H200 profile."""
    spec = ClusterBenchSpec(
        base=BenchSpec(workloads=(workload,), seed=seed, hardware="h200"),
        replicas=4,
        routers=("prefix-affinity/fcfs", "feather/feather"),
    )
    ray, feather = run_cluster_bench(spec)
    return ray, feather


def test_sessions_of_unequal_context_open_where_the_least_prefix_is_resident():
    """long-context on the measured H200, seed 2, 4 replicas: sessions of 10k-60k tokens.
    Opened on the replicas with the fewest groups (within one), a replica got the long
    sessions and set the makespan (0.85x Ray's prefix router, which opens on the fewest
    characters); opened on the least resident prefix KV it ties."""
    ray, feather = _h200_against_prefix_affinity("long-context", seed=2)
    assert feather["output_tok_s"] >= 0.97 * ray["output_tok_s"]
    assert feather["ttft_p99_s"] <= 1.5 * ray["ttft_p99_s"]


def test_a_burst_of_few_groups_splits_by_drain_without_a_later_first_token():
    """long-prefix on the measured H200, 4 replicas: 5 groups of 200 arrive at once, so the
    holders have no measured rate. Kept whole, one replica runs two groups (400 requests
    against 200) and sets the makespan, as under Ray's prefix router; split where the drain
    forecast finishes a request sooner and its first token comes no later, it runs ahead."""
    ray, feather = _h200_against_prefix_affinity("long-prefix", seed=0)
    assert feather["output_tok_s"] >= 1.2 * ray["output_tok_s"]
    assert feather["ttft_p99_s"] <= 1.5 * ray["ttft_p99_s"]
    assert feather["load_imbalance"] <= 1.3
