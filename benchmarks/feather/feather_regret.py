"""Feather's regret matrix: `feather` and `feather-paper` against the engine's default and the
best policy of the same run, for every (bench, workload) row, as a table and a heat map.

Reads `feather bench` JSON files (simulator or `--engine vllm`), or `feather calibrate` reports
(their real-engine end-to-end rows), each given as LABEL=PATH:
  python benchmarks/feather/feather_regret.py sim-h100=benchmarks/sim/bench.json \
      sim-a100=benchmarks/sim/bench-a100.json vllm=benchmarks/vllm/bench.json \
      --json benchmarks/feather/feather-regret.json --plot benchmarks/feather/feather-regret.png
The default is the simulator's `fcfs` or vLLM's own scheduler (`vllm`); the best is the
highest output tokens/s of any row of the same workload (bounds and the cap sweep included).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from feather_lab.bench.record import write_record

DEFAULTS = ("fcfs", "vllm")
POLICIES = ("feather", "feather-paper")


def regret_rows(label: str, rows: list[dict]) -> list[dict]:
    """One row per workload of a bench: each policy's ratio to the default and to the best."""
    by_workload: dict[str, dict[str, float]] = {}
    for r in rows:
        name = r["policy"].split(" ")[0]  # "oracle (cap 64)" -> "oracle"
        by_workload.setdefault(r["workload"], {})[name] = float(r["output_tok_s"])
    out = []
    for workload, speeds in by_workload.items():
        default = next((speeds[d] for d in DEFAULTS if d in speeds), None)
        best_name = max(speeds, key=speeds.__getitem__)
        row = {"bench": label, "workload": workload, "best": best_name}
        for p in POLICIES:
            if p in speeds and default:
                row[f"{p}/default"] = round(speeds[p] / default, 3)
                row[f"{p}/best"] = round(speeds[p] / speeds[best_name], 3)
        out.append(row)
    return out


def bench_rows(record: dict) -> list[dict]:
    """A bench's rows, or a calibration report's real runs as rows."""
    if "rows" in record:
        return record["rows"]
    return [
        {"workload": r["workload"], "policy": r["policy"], "output_tok_s": r["real_tok_s"]}
        for r in record["end_to_end"]
    ]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [f"{p}/{k}" for p in POLICIES for k in ("default", "best")]
    data = np.array([[r.get(c, np.nan) for c in cols] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(rows) + 1.6))
    im = ax.imshow(data, cmap="RdYlGn", vmin=0.5, vmax=1.5, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=20, ha="right")
    ax.set_yticks(range(len(rows)), [f"{r['bench']}: {r['workload']}" for r in rows], fontsize=7)
    for i, j in np.ndindex(data.shape):
        if not np.isnan(data[i, j]):
            ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=6.5)
    fig.colorbar(im, ax=ax, label="output tokens/s ratio")
    ax.set_title("Feather regret: vs the engine's default and vs the best policy of the run")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("benches", nargs="+", help="LABEL=PATH of a feather bench JSON")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    rows: list[dict] = []
    for item in args.benches:
        label, _, path = item.partition("=")
        if not path:
            parser.error(f"expected LABEL=PATH, got {item!r}")
        rows += regret_rows(label, bench_rows(json.loads(Path(path).read_text())))
    for r in rows:
        cells = "  ".join(f"{k}={v}" for k, v in r.items() if "/" in k)
        print(f"{r['bench']:>10} {r['workload']:<28} best={r['best']:<16} {cells}")
    if args.json:
        write_record(args.json, inputs=args.benches, rows=rows)
    if args.plot:
        plot(rows, Path(args.plot))


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
