"""Feather's router and replicas against Ray's two routers on every seed x replica count.

A router rule tuned on one seed's table tends to fix one row and break another, so every
change to `routing.feather_rule.FeatherRule` or its pricing is checked on this whole grid
(the simulated cluster of `feather bench --replicas N` on the measured H200 profile, the
suite's workloads, long-context among them, seeds 0-2, 2/4/8 replicas). Every cell runs the bench's
five router/policy pairs (`bench.cluster.DEFAULT_PAIRS`), so a loss of `feather/feather` is
split into its router half (`feather/fcfs` over the Ray router's `R/fcfs`) and its replica
half (`feather/feather` over `feather/fcfs`); the two multiply to the loss. `--baseline`
reuses the rows that do not depend on Feather's code (`pow2/fcfs`, `prefix-affinity/fcfs`)
from an earlier record. Usage:
  python benchmarks/cluster/cluster_grid.py --json benchmarks/cluster/cluster-grid.json
  python benchmarks/cluster/cluster_grid.py --baseline benchmarks/cluster/cluster-grid.json
  python benchmarks/cluster/cluster_grid.py --table benchmarks/cluster/cluster-grid.json
(`--table`: no run; the record's cells per workload and replica count, over its seeds, as
the Markdown table of benchmarks/cluster/cluster.md.)
It prints, per cell, `feather/feather` over each Ray router, its TTFT p99 over
prefix-affinity's and its load imbalance, marks every cell that misses a check, and ends
with which half carried each throughput loss.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor

from feather_lab.bench.cluster import (
    DEFAULT_PAIRS,
    ClusterBenchSpec,
    add_router_relative,
    run_cluster_bench,
)
from feather_lab.bench.record import write_record
from feather_lab.bench.suite import DEFAULT_HARDWARE, DEFAULT_WORKLOADS, BenchSpec

WORKLOADS = tuple(DEFAULT_WORKLOADS)
PAIRS = tuple(f"{r}/{p}" for r, p in DEFAULT_PAIRS)
RAY = ("pow2/fcfs", "prefix-affinity/fcfs")
"""Ray's routers as deployed: their rows do not depend on Feather's code."""
FEATHER = "feather/feather"
SPLIT = "feather/fcfs"
TTFT_RATIO = 1.5
IMBALANCE = 1.3


def _run(job: tuple[int, int, tuple[str, ...], tuple[str, ...], str]) -> list[dict]:
    replicas, seed, pairs, workloads, hardware = job
    base = BenchSpec(workloads=workloads, seed=seed, hardware=hardware)
    spec = ClusterBenchSpec(base=base, replicas=replicas, routers=pairs)
    return [{**row, "seed": seed} for row in run_cluster_bench(spec)]


def _cell(row: dict) -> tuple[int, int, str]:
    return row["seed"], row["replicas"], row["workload"]


def _pair(row: dict) -> str:
    return f"{row['router']}/{row['policy']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--replicas", default="2,4,8")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--baseline", default=None, help="reuse Ray's rows from this record")
    parser.add_argument("--json", default=None)
    parser.add_argument("--floor", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hardware", default=DEFAULT_HARDWARE)
    parser.add_argument("--table", default=None, help="print this record's table, run nothing")
    args = parser.parse_args()
    if args.table:
        with open(args.table) as f:
            print(_table(json.load(f)["rows"]))
        return
    baseline = []
    if args.baseline:
        with open(args.baseline) as f:
            baseline = [r for r in json.load(f)["rows"] if _pair(r) in RAY]
    pairs = tuple(p for p in PAIRS if p not in RAY) if baseline else PAIRS
    workloads = tuple(args.workloads.split(","))
    jobs = [
        (int(n), int(s), pairs, workloads, args.hardware)
        for s in args.seeds.split(",")
        for n in args.replicas.split(",")
    ]
    with ProcessPoolExecutor(args.workers) as pool:
        fresh = [row for rows in pool.map(_run, jobs) for row in rows]
    cells = {_cell(r) for r in fresh}
    rows = [r for r in baseline if _cell(r) in cells] + fresh
    for seed in {r["seed"] for r in rows}:
        add_router_relative([r for r in rows if r["seed"] == seed])
    if args.json:
        config = {
            "seeds": args.seeds,
            "replicas": args.replicas,
            "workloads": args.workloads,
            "pairs": list(PAIRS),
            "hardware": args.hardware,
        }
        write_record(args.json, config=config, rows=rows)
    _report(rows, args.floor)


def _by_cell(rows: list[dict]) -> dict[tuple[int, int, str], dict[str, dict]]:
    cells: dict[tuple[int, int, str], dict[str, dict]] = {}
    for r in rows:
        cells.setdefault(_cell(r), {})[_pair(r)] = r
    return cells


def _misses(pairs: dict[str, dict], floor: float) -> list[str]:
    """The checks `feather/feather` misses in one cell: throughput below `floor` x
    prefix-affinity's, TTFT p99 over 1.5x its, imbalance over 1.3 and over its."""
    mine, pa = pairs[FEATHER], pairs["prefix-affinity/fcfs"]
    out = []
    if mine["output_tok_s"] < floor * pa["output_tok_s"]:
        out.append("tok/s")
    if mine["ttft_p99_s"] > TTFT_RATIO * pa["ttft_p99_s"]:
        out.append("ttft")
    if mine["load_imbalance"] > max(IMBALANCE, pa["load_imbalance"]):
        out.append("imbalance")
    return out


def _halves(pairs: dict[str, dict], ray: str) -> tuple[float, float]:
    """A loss to `ray` split: router half (feather/fcfs over ray's row, the replicas the
    same), replica half (feather/feather over feather/fcfs, the router the same)."""
    split = pairs[SPLIT]["output_tok_s"]
    return split / pairs[ray]["output_tok_s"], pairs[FEATHER]["output_tok_s"] / split


def _report(rows: list[dict], floor: float) -> None:
    print(
        f"{'seed':>4} {'N':>2} {'workload':<14} {'tok/s':>9} {'vs pow2':>8} {'vs PA':>6} "
        f"{'TTFT99/PA':>9} {'imb':>5} {'PA imb':>6}"
    )
    losses, missed = [], 0
    for cell, pairs in sorted(_by_cell(rows).items()):
        r, pa = pairs[FEATHER], pairs["prefix-affinity/fcfs"]
        misses = _misses(pairs, floor)
        missed += bool(misses)
        ttft = r["ttft_p99_s"] / pa["ttft_p99_s"]
        print(
            f"{cell[0]:>4} {cell[1]:>2} {cell[2]:<14} {r['output_tok_s']:>9,.0f} "
            f"{r['vs_pow2/fcfs']:>8.3f} {r['vs_prefix-affinity/fcfs']:>6.3f} {ttft:>9.2f} "
            f"{r['load_imbalance']:>5.2f} {pa['load_imbalance']:>6.2f}"
            + (f"  < {','.join(misses)}" if misses else "")
        )
        losses += [(cell, ray, pairs) for ray in RAY if r[f"vs_{ray}"] < floor]
    feather = [r for r in rows if _pair(r) == FEATHER]
    for ray in RAY:
        worst = min(r[f"vs_{ray}"] for r in feather)
        print(f"worst {FEATHER} / {ray}: {worst:.3f}")
    print(f"cells missing a check against prefix-affinity/fcfs: {missed} of {len(feather)}")
    print(f"throughput losses below {floor}, split (router half x replica half):")
    for (seed, n, workload), ray, pairs in losses:
        router, replica = _halves(pairs, ray)
        carried = "router" if router < replica else "replicas"
        if max(router, replica) < 1:
            carried = f"both, mostly the {carried}"
        print(
            f"  seed {seed} N {n} {workload:<14} vs {ray:<20} "
            f"{router * replica:.3f} = {router:.3f} x {replica:.3f}: {carried}"
        )


def _table(rows: list[dict]) -> str:
    """Per workload and replica count, over the seeds: `feather/feather` over each Ray
    router (worst, median), its TTFT p99 over prefix-affinity's (worst), its load imbalance
    and prefix-affinity's (worst)."""
    import numpy as np

    out = [
        "| workload | N | vs prefix-affinity worst / median | vs pow2 worst / median "
        "| TTFT p99 / PA's, worst | imbalance (PA's), worst |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, int], list[dict[str, dict]]] = {}
    for (_, n, workload), pairs in _by_cell(rows).items():
        groups.setdefault((workload, n), []).append(pairs)
    for (workload, n), cells in sorted(groups.items()):
        mine = [c[FEATHER] for c in cells]
        pa = [c["prefix-affinity/fcfs"] for c in cells]
        vs = {ray: [r[f"vs_{ray}"] for r in mine] for ray in RAY}
        ttft = max(r["ttft_p99_s"] / p["ttft_p99_s"] for r, p in zip(mine, pa, strict=True))
        imb = max(r["load_imbalance"] for r in mine)
        imb_pa = max(p["load_imbalance"] for p in pa)
        ratios = " | ".join(
            f"{min(vs[ray]):.3f} / {float(np.median(vs[ray])):.3f}" for ray in RAY[::-1]
        )
        out.append(f"| {workload} | {n} | {ratios} | {ttft:.2f} | {imb:.2f} ({imb_pa:.2f}) |")
    return "\n".join(out)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
