"""Feather's router against Ray's two routers on every seed x replica count: the never-worse grid.

A router rule tuned on one seed's table tends to fix one row and break another, so every
change to `routing.rules.FeatherRule` or `routing.forecast` is checked on this whole grid
(the simulated cluster of `feather bench --replicas N`, the suite's workloads, seeds 0-2 by
default, 0-7 recorded, 2/4/8 replicas). Ray's routers do not depend on Feather's code, so
`--baseline` reuses their rows from an earlier record and only Feather's rows are simulated
again (about a minute on 2 cores for seeds 0-2); a full run also simulates pow2 and
prefix-affinity. Usage:
  python benchmarks/cluster/cluster_grid.py --json benchmarks/cluster/cluster-grid.json
  python benchmarks/cluster/cluster_grid.py --baseline benchmarks/cluster/cluster-grid.json
It prints, per cell, Feather's throughput over the better Ray router's, and every cell
below `--floor` (default 0.97: a simulated row has no run-to-run noise, so the margin
stands for the noise a real run would have).
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor

from feather_lab.bench.cluster import ClusterBenchSpec, add_router_relative, run_cluster_bench
from feather_lab.bench.machine import write_record
from feather_lab.bench.suite import BenchSpec

WORKLOADS = (
    "shared-prefix",
    "long-prefix",
    "document-qa",
    "no-sharing",
    "paper-1g",
    "paper-2g",
    "paper-5g",
    "paper-20g",
    "paper-100g",
)
RAY_ROUTERS = ("pow2", "prefix-affinity")
HARDWARE = "h100-free-l2"
"""The profile benchmarks/cluster/cluster-grid.json was recorded on (the bench's default then,
`h100`,
now kept as the free-L2 sensitivity); `--hardware` runs the grid on another."""


def _run(job: tuple[int, int, tuple[str, ...], tuple[str, ...], str]) -> list[dict]:
    replicas, seed, routers, workloads, hardware = job
    base = BenchSpec(workloads=workloads, seed=seed, hardware=hardware)
    spec = ClusterBenchSpec(base=base, replicas=replicas, routers=routers)
    return [{**row, "seed": seed} for row in run_cluster_bench(spec)]


def _cell(row: dict) -> tuple[int, int, str]:
    return row["seed"], row["replicas"], row["workload"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--replicas", default="2,4,8")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--baseline", default=None, help="reuse Ray's rows from this record")
    parser.add_argument("--json", default=None)
    parser.add_argument("--floor", type=float, default=0.97)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hardware", default=HARDWARE)
    args = parser.parse_args()
    baseline = []
    if args.baseline:
        with open(args.baseline) as f:
            baseline = [r for r in json.load(f)["rows"] if r["router"] in RAY_ROUTERS]
    routers = ("feather",) if baseline else (*RAY_ROUTERS, "feather")
    workloads = tuple(args.workloads.split(","))
    jobs = [
        (int(n), int(s), routers, workloads, args.hardware)
        for s in args.seeds.split(",")
        for n in args.replicas.split(",")
    ]
    with ProcessPoolExecutor(args.workers) as pool:
        fresh = [row for rows in pool.map(_run, jobs) for row in rows]
    cells = {_cell(r) for r in fresh}
    rows = [r for r in baseline if _cell(r) in cells] + fresh
    _relative(rows)
    if args.json:
        config = {"seeds": args.seeds, "replicas": args.replicas, "hardware": args.hardware}
        write_record(args.json, config=config, rows=rows)
    _report(rows, args.floor)


def _relative(rows: list[dict]) -> None:
    for seed in {r["seed"] for r in rows}:
        add_router_relative([r for r in rows if r["seed"] == seed])


def _report(rows: list[dict], floor: float) -> None:
    feather = sorted((r for r in rows if r["router"] == "feather"), key=_cell)
    print(f"{'seed':>4} {'N':>2} {'workload':<14} {'tok/s':>9} {'vs pow2':>8} {'vs PA':>6}")
    low = []
    for r in feather:
        worst = min(r["vs_pow2"], r["vs_prefix-affinity"])
        mark = "  <" if worst < floor else ""
        print(
            f"{r['seed']:>4} {r['replicas']:>2} {r['workload']:<14} {r['output_tok_s']:>9,.0f} "
            f"{r['vs_pow2']:>8.3f} {r['vs_prefix-affinity']:>6.3f}{mark}"
        )
        if worst < floor:
            low.append(r)
    worst = min(min(r["vs_pow2"], r["vs_prefix-affinity"]) for r in feather)
    print(f"worst feather / best Ray router: {worst:.3f}; cells below {floor}: {len(low)}")


if __name__ == "__main__":
    main()
