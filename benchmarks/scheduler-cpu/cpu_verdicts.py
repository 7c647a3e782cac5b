"""The default suite's verdicts with the scheduler's CPU on the clock and off.

Reads two `feather bench` records of the same suite (`--scheduler-cpu model` and `off`) and
prints, per workload, feather against fcfs and against the best row of the run (bound rows
aside, as `feather bench` marks the best), with dfs-weight's ratio and the CPU share of
feather's and dfs-weight's steps under the model, as a Markdown table.
Usage: python benchmarks/scheduler-cpu/cpu_verdicts.py benchmarks/sim/bench-cpu-model.json \
           benchmarks/sim/bench-cpu-off.json
"""

from __future__ import annotations

import json
import sys


def by_workload(path: str) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    with open(path) as f:
        rows = json.load(f)["rows"]
    for row in rows:
        if not row["policy"].startswith("bound:"):
            out.setdefault(row["workload"], {})[row["policy"]] = row
    return out


def verdict(rows: dict[str, dict]) -> tuple[float, float, str]:
    """(feather / fcfs, feather / best, the best row's name)."""
    tok = {p: r["output_tok_s"] for p, r in rows.items()}
    best = max(tok, key=tok.get)
    return tok["feather"] / tok["fcfs"], tok["feather"] / tok[best], best


def main(model_path: str, off_path: str) -> None:
    model, off = by_workload(model_path), by_workload(off_path)
    print(
        "| workload | feather/fcfs model (off) | feather/best model (off) | best (model) "
        "| dfs-weight/fcfs model (off) | cpu% feather / dfs-weight (model) |"
    )
    print("|---|---:|---:|---|---:|---:|")
    worst = []
    for w, rows in model.items():
        vf, vb, best = verdict(rows)
        of, ob, _ = verdict(off[w])
        d = rows["dfs-weight"]["output_tok_s"] / rows["fcfs"]["output_tok_s"]
        do = off[w]["dfs-weight"]["output_tok_s"] / off[w]["fcfs"]["output_tok_s"]
        share = [rows[p].get("sched_cpu_share", 0) * 100 for p in ("feather", "dfs-weight")]
        print(
            f"| {w} | {vf:.3f} ({of:.3f}) | {vb:.3f} ({ob:.3f}) | {best} | {d:.3f} ({do:.3f}) "
            f"| {share[0]:.1f} / {share[1]:.1f} |"
        )
        worst.append((vf, vb, of, ob))
    low = [min(x[i] for x in worst) for i in range(4)]
    print(
        f"\nworst: feather/fcfs {low[0]:.3f} (off {low[2]:.3f}), "
        f"feather/best {low[1]:.3f} (off {low[3]:.3f})"
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
