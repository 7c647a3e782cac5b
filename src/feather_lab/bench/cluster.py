"""`feather bench --replicas N --routers ... --policies ...`: (router, replica policy) pairs x
workloads on a simulated cluster.

A router and its replicas' policy are two choices, so a loss can be attributed to either
half: `--routers` x `--policies` runs every pair; `--routers` alone runs each router over its
own replica policy (`routing.rules.REPLICA_POLICY`: `fcfs` under Ray's `pow2` and
`prefix-affinity`, `feather` under Feather's router); neither runs `DEFAULT_PAIRS`, the three
deployments and the two swaps. A `--routers` entry may name its pair, `router/policy`. Each
pair runs on N simulated engines (`sim.cluster`). One row per (workload, pair), named
`router/policy`: output tok/s, TTFT p50/p99, `load_imbalance` (max over mean requests per
replica), prefix groups per replica batch, and throughput relative to every pair on the same
workload (`vs_<router>/<policy>`) and to each router as deployed, over its own replica
policy (`vs_<router>`).
The table, its legend and the plot are the single-engine bench's (`output.results_text`,
`report.plot_results`), its columns those `bench.columns` declares for a cluster.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from feather_lab.bench.context import fit_context
from feather_lab.bench.suite import BenchSpec
from feather_lab.sim.cluster import simulate_cluster
from feather_lab.workloads.presets import build_workload
from feather_sched.cost import load_hardware
from feather_sched.cost.resolve import resolve_cost
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.registry import make_policy, policy_names
from feather_sched.routing.rules import REPLICA_POLICY, RULES, make_rule

DEFAULT_ROUTERS = ("pow2", "prefix-affinity", "feather")
DEFAULT_PAIRS = (
    ("pow2", "fcfs"),
    ("prefix-affinity", "fcfs"),
    ("prefix-affinity", "feather"),
    ("feather", "fcfs"),
    ("feather", "feather"),
)
"""Ray's two routers and Feather's as deployed, and the two swaps that split a difference
between Ray's prefix router and Feather's into its router half and its replica half."""


def parse_pairs(routers: Sequence[str] | None, policies: Sequence[str] | None) -> list:
    """The (router, replica policy) pairs the options name: every router x every policy; a
    router alone over its own policy; `router/policy` as given; neither: `DEFAULT_PAIRS`."""
    if routers is None and policies is None:
        return list(DEFAULT_PAIRS)
    pairs: list[tuple[str, str]] = []
    for entry in routers if routers is not None else DEFAULT_ROUTERS:
        router, _, own = entry.partition("/")
        if own and policies is not None:
            raise ValueError(
                f"--routers {entry!r} names its policy; --policies applies to routers named alone"
            )
        chosen = [own] if own else (policies or [REPLICA_POLICY.get(router, "fcfs")])
        pairs += [(router, p) for p in chosen if (router, p) not in pairs]
    return pairs


@dataclass(frozen=True)
class ClusterBenchSpec:
    base: BenchSpec = field(default_factory=BenchSpec)
    """Workloads, hardware, model, engine settings: as the single-engine bench."""
    replicas: int = 4
    routers: Sequence[str] | None = None
    """Routers, each over its own replica policy, or `router/policy` pairs (`parse_pairs`;
    None: `DEFAULT_PAIRS`)."""
    router_options: dict = field(default_factory=dict)
    """Keyword options per router name (e.g. {"feather": {"balance": 1.3}})."""
    policies: Sequence[str] | None = None
    """Replica policies: each router runs over every one (None: its own)."""

    def pairs(self) -> list[tuple[str, str]]:
        return parse_pairs(self.routers, self.policies)

    def validate(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        if any(names is not None and not names for names in (self.routers, self.policies)):
            raise ValueError("no routers to run")
        pairs = self.pairs()
        bad = [r for r, _ in pairs if r not in RULES]
        if bad:
            raise ValueError(f"unknown routers {bad}; valid: {', '.join(RULES)}")
        known = policy_names()
        bad = [p for _, p in pairs if p not in known]
        if bad:
            raise ValueError(f"unknown replica policies {bad}; valid: {', '.join(known)}")
        if not self.base.workloads:
            raise ValueError("no workloads to run")

    def total_runs(self) -> int:
        return len(self.base.workloads) * len(self.pairs())


def _replica_policy(name: str, prior: StepCostModel | None) -> Callable:
    if name == "feather":
        return lambda: make_policy(name, cost=prior)
    return lambda: make_policy(name)


def run_cluster_bench(
    spec: ClusterBenchSpec, on_progress: Callable[[str], None] | None = None
) -> list[dict]:
    """Simulate every (workload, router, replica policy) on `spec.replicas` engines; a row
    each."""
    spec.validate()
    base = spec.base
    cost = resolve_cost(base.hardware, base.model, base.kernel)
    pairs = spec.pairs()
    # feather's prior (its router's and its replicas' policy's), checked before any run
    prior = base.feather_cost() if any("feather" in pair for pair in pairs) else None
    tick = on_progress or (lambda _label: None)
    limit = cost.model.max_context_tokens
    workloads = {}
    for wname in base.workloads:
        requests = build_workload(wname).generate(base.seed)
        workloads[wname] = fit_context(
            requests, limit, base.drop_overlong, f"{wname} on {base.model}"
        )
    rows: list[dict] = []
    for wname, (requests, dropped) in workloads.items():
        engine = base.engine_for(wname)
        for router, policy in pairs:
            options = dict(spec.router_options.get(router, {}))
            if router == "feather":  # the router prices drains with the policy's own prior
                options.setdefault("cost", prior if prior is not None else cost)
                options.setdefault("max_num_seqs", engine.max_num_seqs)
            rule = make_rule(router, seed=base.seed, **options)
            result = simulate_cluster(
                requests, rule, _replica_policy(policy, prior), cost, engine, spec.replicas
            )
            rows.append(
                {
                    "workload": wname,
                    "max_num_seqs": engine.max_num_seqs,
                    **result.summary(),
                    "dropped_overlong": dropped,
                }
            )
            tick(f"{wname} / {router}/{policy}")
    add_router_relative(rows)
    return rows


def add_router_relative(rows: Sequence[dict]) -> None:
    """`vs_<router>/<policy>`: each row's output tok/s over that pair's row on the same
    workload (and replica count); `vs_<router>`: over the router as deployed (its own
    replica policy, `REPLICA_POLICY`; a router run over others only: its first row)."""
    tok = {(r["workload"], r["replicas"], _pair(r)): r["output_tok_s"] for r in rows}
    pairs = list(dict.fromkeys(_pair(r) for r in rows))
    deployed = {}
    for router, policy in pairs:
        if router not in deployed or policy == REPLICA_POLICY.get(router):
            deployed[router] = (router, policy)
    for r in rows:
        cell = (r["workload"], r["replicas"])
        mine = r["output_tok_s"]
        for other in pairs:
            b = tok.get((*cell, other))
            r[f"vs_{'/'.join(other)}"] = round(mine / b, 3) if b else None
        for router, pair in deployed.items():
            b = tok.get((*cell, pair))
            r[f"vs_{router}"] = round(mine / b, 3) if b else None


def _pair(row: dict) -> tuple[str, str]:
    return row["router"], row["policy"]


def cluster_title(spec: ClusterBenchSpec) -> str:
    from feather_lab.bench.runner import scheduler_cpu_label

    base = spec.base
    hw = load_hardware(base.hardware)
    return (
        f"feather bench: {spec.replicas} replicas, {hw.name} ({hw.provenance}), "
        f"model {base.model}, "
        f"{base.kernel} kernel, seed {base.seed}, {scheduler_cpu_label(base)}"
    )


def cluster_config(spec: ClusterBenchSpec) -> dict[str, Any]:
    """The record's config: what ran, each router's replica policy included."""
    from feather_lab.bench.runner import scheduler_cpu_provenance

    base = spec.base
    return {
        **scheduler_cpu_provenance(base),
        "replicas": spec.replicas,
        "pairs": ["/".join(pair) for pair in spec.pairs()],
        "hardware": base.hardware,
        "model": base.model,
        "kernel": base.kernel,
        "seed": base.seed,
    }


def cli_cluster_bench(
    base: BenchSpec,
    replicas: int,
    routers: str | None,
    outputs: tuple[Path, Path],
    fail: Callable[[Exception], NoReturn],
    policies: Sequence[str] | None = None,
) -> None:
    """`feather bench --replicas N [--routers ...] [--policies ...]`: every check first,
    then the runs; the table with its legend first, as the single-engine bench prints them
    (`output.results_text`), the JSON record (first: a finished run is never lost), then
    the plot."""
    from feather_lab.bench.output import (
        check_output_path,
        check_plot_path,
        replacing,
        results_text,
        terminal_width,
    )
    from feather_lab.bench.record import require_clean, write_record
    from feather_lab.bench.report import plot_results

    json_out, plot = outputs
    names = None if routers is None else [r.strip() for r in routers.split(",") if r.strip()]
    spec = ClusterBenchSpec(base=base, replicas=replicas, routers=names, policies=policies)
    try:
        spec.validate()
        require_clean()
        check_output_path(json_out, "--json")
        check_plot_path(plot)
        rows = run_cluster_bench(spec, on_progress=lambda label: print(label, file=sys.stderr))
    except (ValueError, FileNotFoundError) as err:
        fail(err)
    title = cluster_title(spec)
    print(results_text(rows, title, terminal_width(), with_legend=True), flush=True)
    replacing(json_out)
    write_record(json_out, config=cluster_config(spec), rows=rows)
    replacing(plot)
    try:
        plot_results(rows, plot, title)
    except Exception as err:  # the rows are saved; a plot failure only loses the plot
        fail(RuntimeError(f"rows saved to {json_out}, but the plot failed: {err}"))
    print(f"wrote {json_out}\nwrote {plot}", flush=True)
