"""`feather bench --replicas N --routers ...`: routers x workloads on a simulated cluster.

Each router runs with its replica policy (`routing.rules.REPLICA_POLICY`: `fcfs` under Ray's
`pow2` and `prefix-affinity`, `feather` under Feather's router) on N simulated engines behind
it (`sim.cluster`). One row per (workload, router): output tok/s, TTFT p50/p99,
`load_imbalance` (max over mean requests per replica), prefix groups per replica batch, and
each row's throughput relative to every other router's on the same workload (`vs_<router>`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rich.table import Table

from feather_sched.bench.context import fit_context
from feather_sched.bench.suite import BenchSpec
from feather_sched.cost.resolve import resolve_cost
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.registry import make_policy
from feather_sched.routing.rules import REPLICA_POLICY, RULES, make_rule
from feather_sched.sim.cluster import simulate_cluster
from feather_sched.workloads.presets import build_workload

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


_COLUMNS = (
    ("output_tok_s", "out tok/s", "{:,.0f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.2f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("load_imbalance", "load imbalance", "{:.2f}"),
    ("prefix_groups_per_batch", "groups/batch", "{:.1f}"),
    ("prefix_hit_rate", "prefix hit", "{:.2f}"),
)


def cluster_table(rows: Sequence[dict], title: str) -> Table:
    table = Table(title=title)
    for col in ("workload", "N", "router", "policy"):
        table.add_column(col)
    for _, header, _ in _COLUMNS:
        table.add_column(header, justify="right")
    routers = list(dict.fromkeys(r["router"] for r in rows))
    for other in routers:
        table.add_column(f"vs {other}", justify="right")
    last = None
    for r in rows:
        if last is not None and r["workload"] != last:
            table.add_section()
        last = r["workload"]
        cells = [fmt.format(r[k]) if r.get(k) is not None else "-" for k, _, fmt in _COLUMNS]
        rel = ["-" if r.get(f"vs_{o}") is None else f"{r[f'vs_{o}']:.2f}x" for o in routers]
        table.add_row(r["workload"], str(r["replicas"]), r["router"], r["policy"], *cells, *rel)
    return table


def cli_cluster_bench(base: BenchSpec, replicas: int, routers: str | None, json_out, console, fail):
    """`feather bench --replicas N [--routers ...]`: run, print the table, write the JSON."""
    from feather_sched.bench.machine import write_record

    names = [r.strip() for r in (routers or ",".join(DEFAULT_ROUTERS)).split(",") if r.strip()]
    spec = ClusterBenchSpec(base=base, replicas=replicas, routers=names)
    try:
        spec.validate()
        rows = run_cluster_bench(spec, on_progress=lambda label: print(label, file=sys.stderr))
    except (ValueError, FileNotFoundError) as err:
        fail(err)
    title = (
        f"feather bench: {replicas} replicas, {base.hardware} + {base.model}, "
        f"{base.kernel} kernel, seed {base.seed}"
    )
    config = {
        "replicas": replicas,
        "routers": names,
        "replica_policy": {r: REPLICA_POLICY[r] for r in names},
        "hardware": base.hardware,
        "model": base.model,
        "kernel": base.kernel,
        "seed": base.seed,
    }
    write_record(json_out, config=config, rows=rows)  # first: a finished run is never lost
    console.print(cluster_table(rows, title))
    console.print(f"wrote {json_out}")
