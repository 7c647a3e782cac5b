"""The simulator's multi-replica mode and the routing rules (no Ray needed)."""

from __future__ import annotations

import numpy as np
import pytest

from feather_lab.bench.cluster import ClusterBenchSpec, run_cluster_bench
from feather_lab.bench.suite import BenchSpec
from feather_lab.sim.cluster import simulate_cluster
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.workloads.registry import make_workload
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.registry import make_policy
from feather_sched.request import Request
from feather_sched.routing.prefix_tree import PrefixTree, tokens_to_text
from feather_sched.routing.rules import (
    FeatherRule,
    PrefixAffinityRule,
    RoutingRequest,
    make_rule,
    pick,
)

COST = StepCostModel("h100-free-l2", "llama-3.1-8b", "paged")


def _groups(groups=4, per=12, prefix=512, seed=0, arrival_gap=0.0):
    rng = np.random.default_rng(seed)
    heads = [rng.integers(0, 32000, prefix) for _ in range(groups)]
    reqs = [
        Request(
            f"g{g}-{i}", np.concatenate([heads[g], rng.integers(0, 32000, 16)]), 8, group=f"g{g}"
        )
        for g in range(groups)
        for i in range(per)
    ]
    order = rng.permutation(len(reqs))
    return [
        Request(
            reqs[j].request_id, reqs[j].prompt, 8, arrival_time=k * arrival_gap, group=reqs[j].group
        )
        for k, j in enumerate(order)
    ]


def test_one_replica_reproduces_the_single_engine():
    reqs = make_workload("shared-prefix", num_groups=4, prompts_per_group=8).generate(0)
    one = simulate(reqs, make_policy("fcfs"), COST, EngineConfig())
    cluster = simulate_cluster(
        reqs, make_rule("pow2"), lambda: make_policy("fcfs"), COST, EngineConfig(), 1
    )
    assert sorted((r.request_id, r.first_token, r.finish) for r in one.records) == sorted(
        (r.request_id, r.first_token, r.finish) for r in cluster.records
    )


@pytest.mark.parametrize("router", ["pow2", "prefix-affinity", "feather"])
def test_every_request_finishes_exactly_once(router):
    reqs = _groups(arrival_gap=0.001)
    res = simulate_cluster(
        reqs, make_rule(router), lambda: make_policy("fcfs"), COST, EngineConfig(), 3
    )
    ids = [r.request_id for r in res.records]
    assert sorted(ids) == sorted(r.request_id for r in reqs)
    assert sum(res.assigned) == len(reqs)
    row = res.summary()
    assert row["load_imbalance"] >= 1.0 and row["requests"] == len(reqs)


def test_feather_concentrates_groups_and_stays_balanced():
    reqs = _groups(groups=8, per=16)
    res = simulate_cluster(
        reqs, make_rule("feather"), lambda: make_policy("fcfs"), COST, EngineConfig(), 4
    )
    where: dict[str, set] = {}
    by_id = {r.request_id: r.group for r in reqs}
    for i, rep in enumerate(res.replicas):
        for rec in rep.records:
            where.setdefault(by_id[rec.request_id], set()).add(i)
    assert np.mean([len(v) for v in where.values()]) <= 1.25
    assert res.summary()["load_imbalance"] <= 1.25
    pow2 = simulate_cluster(
        reqs, make_rule("pow2"), lambda: make_policy("fcfs"), COST, EngineConfig(), 4
    ).summary()
    assert res.summary()["mean_prefix_groups"] < pow2["mean_prefix_groups"]


def test_killed_replica_requests_are_rerouted_once():
    reqs = _groups(groups=4, per=24, arrival_gap=0.002)
    res = simulate_cluster(
        reqs,
        make_rule("feather"),
        lambda: make_policy("fcfs"),
        COST,
        EngineConfig(),
        3,
        kill={1: 0.05},
    )
    assert sorted(r.request_id for r in res.records) == sorted(r.request_id for r in reqs)
    assert len(res.replicas) == 2


def test_conversation_turns_wait_for_their_parent_across_replicas():
    reqs = make_workload("multi-turn", num_conversations=6, turns=3).generate(0)
    res = simulate_cluster(
        reqs, make_rule("feather"), lambda: make_policy("fcfs"), COST, EngineConfig(), 3
    )
    fin = {r.request_id: r for r in res.records}
    for r in reqs:
        dep = r.meta.get("depends_on")
        if dep:
            assert fin[r.request_id].arrival >= fin[dep].finish


def test_pick_is_rays_choice():
    assert pick([[], ["a", "b"]], {"a": 3, "b": 1}) == "b"
    assert pick([["a", "b"]], {"a": 1, "b": 1}) == "a"
    assert pick([[]], {}) is None


def test_prefix_tree_port_matches_rays_examples():
    t = PrefixTree()
    t.add_tenants(["t1", "t2"], 0)
    t.insert("helloworld", "t1", 1)
    t.insert("hellothere", "t2", 2)
    t.insert("hellothomas", "t2", 3)
    assert t.prefix_match("hello") == ("hello", ["t1", "t2"])
    assert t.prefix_match("hellothe") == ("hellothe", ["t2"])
    assert t.prefix_match("helloworld!") == ("helloworld", ["t1"])
    assert t.prefix_match("xyz") == ("", ["t1", "t2"])
    assert t.tenant_to_char_count == {"t1": 10, "t2": 14}  # as Ray's own tree gives
    assert t.get_smallest_tenants() == ["t1"]
    t.remove_tenants(["t2"])
    assert t.prefix_match("hellothere") == ("hello", ["t1"])
    assert tokens_to_text(np.array([0, 55296, 7])) == "\x00" + chr(55296 + 0x800) + "\x07"


def test_prefix_affinity_rule_follows_matches_and_smallest_tenants():
    rule = PrefixAffinityRule()
    for r in ("a", "b"):
        rule.add_replica(r, 0)
    x = RoutingRequest("x", text="shared system prompt " * 10 + "q1")
    assert rule.rank(x, ["a", "b"], {}, 0) == [["a", "b"]]  # smallest tenants: both empty
    rule.on_routed(x, "a", 0)
    y = RoutingRequest("y", text="shared system prompt " * 10 + "q2")
    assert rule.rank(y, ["a", "b"], {}, 0) == [["a"]]  # match rate >= 0.1
    z = RoutingRequest("z", text="something else entirely")
    assert rule.rank(z, ["a", "b"], {}, 0) == [["b"]]  # no match: the smallest tenant


def test_feather_rule_opens_groups_on_the_emptiest_replica_and_forgets_dead_ones():
    rule = FeatherRule(StepCostModel("h100", "llama-3.1-8b"), balance=1.2, chunk_tokens=4, slack=0)
    for r in ("a", "b"):
        rule.add_replica(r, 0)
    p = RoutingRequest("p", tokens=np.arange(32))
    ((first, _),) = [rule.rank(p, ["a", "b"], {}, 0)]
    rule.on_routed(p, first[0], 0)
    q = RoutingRequest("q", tokens=np.arange(40))
    assert rule.rank(q, ["a", "b"], {}, 0)[0] == [first[0]]
    other = "b" if first[0] == "a" else "a"
    s = RoutingRequest("s", tokens=np.arange(100, 140))
    assert rule.rank(s, ["a", "b"], {}, 0)[0] == [other]  # new group: fewest groups
    rule.remove_replica(first[0])
    assert rule.depth(q, first[0], 0) == 0
    rule.on_finished("p", first[0], 1)  # finishing on a dead replica is harmless


def test_cluster_bench_rows():
    spec = ClusterBenchSpec(
        base=BenchSpec(workloads=("document-qa",)), replicas=2, routers=("pow2", "feather")
    )
    rows = run_cluster_bench(spec)
    assert [r["router"] for r in rows] == ["pow2", "feather"]
    assert [r["policy"] for r in rows] == ["fcfs", "feather"]
    for key in (
        "output_tok_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "load_imbalance",
        "mean_prefix_groups",
        "vs_pow2",
    ):
        assert key in rows[0]
    with pytest.raises(ValueError):
        ClusterBenchSpec(routers=("nope",)).validate()


def test_cli_bench_replicas(tmp_path):
    """The cluster bench goes through the single-engine bench's table, plot and `show`:
    80 columns when piped, the plot written, every row named by its router."""
    import json

    from typer.testing import CliRunner

    from feather_lab.cli import app

    out, plot = tmp_path / "c.json", tmp_path / "c.png"
    args = ["bench", "--replicas", "2", "--routers", "pow2,prefix-affinity,feather"]
    args += ["-w", "document-qa", "--json", str(out), "--plot", str(plot)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["router"], r["policy"], r["replicas"]) for r in rows] == [
        ("pow2", "fcfs", 2),
        ("prefix-affinity", "fcfs", 2),
        ("feather", "feather", 2),
    ]
    assert plot.is_file() and plot.stat().st_size > 0
    assert max(len(line) for line in result.stdout.splitlines() if line.startswith(" ")) <= 80
    shown = CliRunner().invoke(app, ["show", str(out)])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    header = next(line for line in lines if line.startswith("router/policy"))
    assert header.split()[:3] == ["router/policy", "tok/s", "xpow2"]
    names = [line.split()[0].rstrip("*=") for line in lines if line.startswith(" ")]
    assert names == ["pow2/fcfs", "prefix-affinity/fcfs", "feather/feather"]
    assert "document-qa, 2 replicas, 128 requests" in lines
    assert all(len(line) <= 80 for line in lines if str(out) not in line)  # bar the file
    md = CliRunner().invoke(app, ["show", "--markdown", str(out)])
    assert md.stdout.startswith("| workload | replicas | router/policy | tok/s | xpow2 |")
    bad = CliRunner().invoke(app, ["bench", "--replicas", "2", "--routers", "nope"])
    assert bad.exit_code != 0


def test_cli_bench_replicas_checks_the_plot_path_first(tmp_path):
    from typer.testing import CliRunner

    from feather_lab.cli import app

    out = tmp_path / "c.json"
    args = ["bench", "--replicas", "2", "-w", "document-qa", "--json", str(out)]
    result = CliRunner().invoke(app, [*args, "--plot", str(tmp_path / "c.txt")])
    assert result.exit_code == 2 and "--plot" in result.stderr
    assert not out.exists()


def test_cluster_rows_have_every_declared_cluster_column():
    """The columns a cluster table shows are fields the cluster bench writes."""
    from feather_lab.bench.columns import columns_of
    from feather_lab.bench.rows import CLUSTER

    spec = ClusterBenchSpec(
        base=BenchSpec(workloads=("document-qa",)), replicas=2, routers=("pow2", "feather")
    )
    rows = run_cluster_bench(spec)
    missing = {c.key for c in columns_of(CLUSTER, "pow2") if c.key not in rows[0]}
    assert not missing


def test_cluster_pairs_split_router_from_replica_policy():
    """Router and replica policy are two choices: neither given runs the three deployments
    and the two swaps; routers x policies runs every pair; a pair may be named whole."""
    from feather_lab.bench.cluster import DEFAULT_PAIRS, parse_pairs

    assert parse_pairs(None, None) == list(DEFAULT_PAIRS)
    assert ("prefix-affinity", "feather") in DEFAULT_PAIRS and ("feather", "fcfs") in DEFAULT_PAIRS
    assert parse_pairs(["pow2", "feather"], None) == [("pow2", "fcfs"), ("feather", "feather")]
    assert parse_pairs(["pow2", "feather"], ["fcfs", "feather"]) == [
        ("pow2", "fcfs"),
        ("pow2", "feather"),
        ("feather", "fcfs"),
        ("feather", "feather"),
    ]
    assert parse_pairs(["feather/fcfs"], None) == [("feather", "fcfs")]
    with pytest.raises(ValueError, match="names its policy"):
        parse_pairs(["feather/fcfs"], ["feather"])
    with pytest.raises(ValueError, match="unknown replica policies"):
        ClusterBenchSpec(routers=("pow2/nope",)).validate()


def test_cluster_bench_split_rows_compare_pairs():
    spec = ClusterBenchSpec(
        base=BenchSpec(workloads=("document-qa",)),
        replicas=2,
        routers=("prefix-affinity", "feather"),
        policies=("fcfs", "feather"),
    )
    rows = run_cluster_bench(spec)
    assert [f"{r['router']}/{r['policy']}" for r in rows] == [
        "prefix-affinity/fcfs",
        "prefix-affinity/feather",
        "feather/fcfs",
        "feather/feather",
    ]
    by = {f"{r['router']}/{r['policy']}": r for r in rows}
    swap = by["feather/fcfs"]
    want = swap["output_tok_s"] / by["prefix-affinity/fcfs"]["output_tok_s"]
    assert swap["vs_prefix-affinity/fcfs"] == pytest.approx(want, abs=1e-3)
    # each router as deployed: prefix-affinity over fcfs, feather over feather
    assert swap["vs_prefix-affinity"] == swap["vs_prefix-affinity/fcfs"]
    assert swap["vs_feather"] == swap["vs_feather/feather"]


def test_cli_bench_replicas_policies(tmp_path):
    import json

    from typer.testing import CliRunner

    from feather_lab.cli import app

    out, plot = tmp_path / "c.json", tmp_path / "c.png"
    args = ["bench", "--replicas", "2", "--routers", "feather", "--policies", "fcfs,feather"]
    args += ["-w", "document-qa", "--json", str(out), "--plot", str(plot)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["router"], r["policy"]) for r in rows] == [
        ("feather", "fcfs"),
        ("feather", "feather"),
    ]
    bad = CliRunner().invoke(app, [*args[:5], "--policies", "nope", "-w", "document-qa"])
    assert bad.exit_code == 2 and "nope" in bad.output
