"""`feather bench --replicas N --routers ...`: routers x workloads on a simulated cluster.

Each router runs with its replica policy (`routing.rules.REPLICA_POLICY`: `fcfs` under Ray's
`pow2` and `prefix-affinity`, `feather` under Feather's router) on N simulated engines behind
it (`sim.cluster`). One row per (workload, router): output tok/s, TTFT p50/p99,
`load_imbalance` (max over mean requests per replica), prefix groups per replica batch, and
each row's throughput relative to every other router's on the same workload (`vs_<router>`).
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
from feather_sched.policies.registry import make_policy
from feather_sched.routing.rules import REPLICA_POLICY, RULES, make_rule

DEFAULT_ROUTERS = ("pow2", "prefix-affinity", "feather")


@dataclass(frozen=True)
class ClusterBenchSpec:
    base: BenchSpec = field(default_factory=BenchSpec)
    """Workloads, hardware, model, engine settings: as the single-engine bench."""
    replicas: int = 4
    routers: Sequence[str] = DEFAULT_ROUTERS
    router_options: dict = field(default_factory=dict)
    """Keyword options per router name (e.g. {"feather": {"balance": 1.3}})."""

    def validate(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        bad = [r for r in self.routers if r not in RULES]
        if bad:
            raise ValueError(f"unknown routers {bad}; valid: {', '.join(RULES)}")
        if not self.routers:
            raise ValueError("no routers to run")
        if not self.base.workloads:
            raise ValueError("no workloads to run")

    def total_runs(self) -> int:
        return len(self.base.workloads) * len(self.routers)


def _replica_policy(name: str, prior: StepCostModel | None) -> Callable:
    if name == "feather":
        return lambda: make_policy(name, cost=prior)
    return lambda: make_policy(name)


def run_cluster_bench(
    spec: ClusterBenchSpec, on_progress: Callable[[str], None] | None = None
) -> list[dict]:
    """Simulate every (workload, router) pair on `spec.replicas` engines; a row each."""
    spec.validate()
    base = spec.base
    cost = resolve_cost(base.hardware, base.model, base.kernel)
    # feather's prior (its router's and its replicas' policy's), checked before any run
    prior = base.feather_cost() if "feather" in spec.routers else None
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
        for router in spec.routers:
            options = dict(spec.router_options.get(router, {}))
            if router == "feather":  # the router prices drains with the policy's own prior
                options.setdefault("cost", prior if prior is not None else cost)
                options.setdefault("max_num_seqs", engine.max_num_seqs)
            rule = make_rule(router, seed=base.seed, **options)
            policy = REPLICA_POLICY[router]
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
            tick(f"{wname} / {router}")
    add_router_relative(rows)
    return rows


def add_router_relative(rows: Sequence[dict]) -> None:
    """`vs_<router>`: each row's output tok/s over that router's row on the same workload
    (and replica count)."""
    base = {(r["workload"], r["replicas"], r["router"]): r["output_tok_s"] for r in rows}
    routers = list(dict.fromkeys(r["router"] for r in rows))
    for r in rows:
        for other in routers:
            b = base.get((r["workload"], r["replicas"], other))
            r[f"vs_{other}"] = round(r["output_tok_s"] / b, 3) if b else None


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
        "routers": list(spec.routers),
        "replica_policy": {r: REPLICA_POLICY[r] for r in spec.routers},
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
) -> None:
    """`feather bench --replicas N [--routers ...]`: every check first, then the runs; the
    table with its legend first, as the single-engine bench prints them (`output.results_text`),
    the JSON record (first: a finished run is never lost), then the plot."""
    from feather_lab.bench.machine import write_record
    from feather_lab.bench.output import (
        check_output_path,
        check_plot_path,
        replacing,
        results_text,
        terminal_width,
    )
    from feather_lab.bench.report import plot_results

    json_out, plot = outputs
    names = [r.strip() for r in (routers or ",".join(DEFAULT_ROUTERS)).split(",") if r.strip()]
    spec = ClusterBenchSpec(base=base, replicas=replicas, routers=names)
    try:
        spec.validate()
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
