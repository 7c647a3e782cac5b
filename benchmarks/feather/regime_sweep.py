"""Feather across the locality regime: the same bench suite on step-cost profiles from the
measured H200 (a mixed batch decodes about as fast as a homogeneous one) to the free-L2
sensitivity (a homogeneous batch up to ~11x faster), against the best policy of each run.

Profiles: `h200` (measured), `cpu` (the CPU fit of the real vLLM engine: a sequential kernel
whose reuse depends on batch order; with `qwen2.5-0.5b`, as the fit's own `kv-bound` model
has an 8,192-token context the paper's 10,000-token prefixes exceed), `h100-half-l2`
(benchmarks/feather/regime-between.json: every constant halfway between `h100` and
`h100-free-l2`) and `h100-free-l2`. For each (profile, workload): Feather's output tok/s over
the best other policy's among those whose TTFT p99 is within `--ttft-factor` x FCFS's, and
whether Feather's own TTFT p99 is within it. Deterministic (the simulator, seed 0).
Usage: python benchmarks/feather/regime_sweep.py OUT.json [-w W,..] [--policies P,..]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from feather_lab.bench.record import write_record
from feather_lab.bench.suite import BenchSpec, run_bench

HERE = Path(__file__).resolve().parent
PROFILES: dict[str, tuple[str, str]] = {
    "h200": ("h200", "llama-3.1-8b"),
    "cpu": ("cpu", "qwen2.5-0.5b"),
    "h100-half-l2": (str(HERE / "regime-between.json"), "llama-3.1-8b"),
    "h100-free-l2": ("h100-free-l2", "llama-3.1-8b"),
}
"""Label -> (hardware profile name or JSON path, model), from least to most locality."""
WORKLOADS = ("paper-2g", "paper-5g", "paper-20g")
POLICIES = ("fcfs", "feather", "feather-hold", "feather-paper", "max-homogeneous")
TTFT_FACTOR = 1.5


def verdict(rows: list[dict], factor: float = TTFT_FACTOR) -> dict:
    """One run's comparison: Feather over the best other policy whose TTFT p99 is within
    `factor` x FCFS's (None when no other qualifies), and Feather's own TTFT ratio."""
    by = {r["policy"]: r for r in rows}
    limit = factor * by["fcfs"]["ttft_p99_s"]
    feather = by["feather"]
    eligible = [r for r in rows if r["policy"] != "feather" and r["ttft_p99_s"] <= limit]
    best = max(eligible, key=lambda r: r["output_tok_s"], default=None)
    return {
        "feather_tok_s": feather["output_tok_s"],
        "best_policy": None if best is None else best["policy"],
        "best_tok_s": None if best is None else best["output_tok_s"],
        "x_best": None
        if best is None
        else round(feather["output_tok_s"] / best["output_tok_s"], 3),
        "feather_ttft_p99_s": feather["ttft_p99_s"],
        "fcfs_ttft_p99_s": by["fcfs"]["ttft_p99_s"],
        "feather_ttft_ok": feather["ttft_p99_s"] <= limit,
    }


def sweep(workloads: list[str], policies: list[str]) -> tuple[list[dict], list[dict]]:
    """Every profile's bench rows, and one verdict per (profile, workload)."""
    rows, table = [], []
    for label, (hardware, model) in PROFILES.items():
        spec = BenchSpec(
            workloads=tuple(workloads), policies=tuple(policies), hardware=hardware, model=model
        )
        spec.validate()
        done = run_bench(spec, on_progress=lambda name, label=label: print(f"  {label}: {name}"))
        for r in done:
            r["profile"] = label
        rows.extend(done)
        for w in workloads:
            table.append(
                {
                    "profile": label,
                    "workload": w,
                    **verdict([r for r in done if r["workload"] == w]),
                }
            )
    return rows, table


def print_table(table: list[dict]) -> None:
    print(
        f"{'profile':14} {'workload':10} {'feather':>8} {'best':>8} {'best policy':16} "
        f"{'x best':>6} {'ttft99 f/fcfs':>14}"
    )
    for t in table:
        best = "-" if t["best_tok_s"] is None else f"{t['best_tok_s']:,.0f}"
        xb = "-" if t["x_best"] is None else f"{t['x_best']:.2f}"
        ok = "" if t["feather_ttft_ok"] else " (over)"
        print(
            f"{t['profile']:14} {t['workload']:10} {t['feather_tok_s']:8,.0f} {best:>8} "
            f"{t['best_policy'] or '-':16} {xb:>6} "
            f"{t['feather_ttft_p99_s']:5.2f}/{t['fcfs_ttft_p99_s']:5.2f}{ok}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="JSON record to write")
    ap.add_argument("-w", "--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    policies = [p for p in args.policies.split(",") if p]
    missing = {"fcfs", "feather"} - set(policies)
    if missing:
        print(f"error: --policies must include {sorted(missing)}; got {policies}", file=sys.stderr)
        return 2
    try:
        BenchSpec(workloads=tuple(workloads), policies=tuple(policies)).validate()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows, table = sweep(workloads, policies)
    print_table(table)
    config = {
        "profiles": PROFILES,
        "workloads": workloads,
        "policies": policies,
        "ttft_factor": TTFT_FACTOR,
    }
    write_record(args.out, config=config, table=table, rows=rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    raise SystemExit(main())
