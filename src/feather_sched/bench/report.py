"""Tables and plots of `feather bench` rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def add_relative(
    rows: Sequence[dict],
    baseline: str,
    columns: Sequence[tuple[str, str]] = (("output_tok_s", "vs_fcfs"),),
) -> None:
    """Each row's speed relative to the baseline policy's row of the same workload, in
    place: for each (key, out) pair, `out` = row[key] / baseline row[key] (None without a
    baseline row, or when its value is 0). One rule for every bench's `vs_fcfs` column, so
    the simulated and the real-engine tables compare alike."""
    for key, out in columns:
        base = {r["workload"]: r[key] for r in rows if r["policy"] == baseline}
        for r in rows:
            b = base.get(r["workload"])
            r[out] = round(r[key] / b, 3) if b else None


BOUNDS = ("oracle", "max-homogeneous", "bound:unbounded-kv")
"""Rows that are references (a swept cap, a one-group-at-a-time extreme), not deployable
policies: drawn hatched, after the policies."""


def plot_results(rows: Sequence[dict], path: Path, title: str) -> Path:
    """Three panels per workload: output tokens/s (linear), throughput relative to FCFS
    (linear, 1.0 line) and TTFT/latency p99 (lower is better). Bounds are hatched and set
    apart at the right of each group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    seen = list(dict.fromkeys(r["policy"] for r in rows))
    policies = [p for p in seen if p not in BOUNDS] + [p for p in seen if p in BOUNDS]
    value = {(r["workload"], r["policy"]): r for r in rows}
    x = np.arange(len(workloads))
    n = max(1, len(policies))
    width = 0.8 / (n + (1 if any(p in BOUNDS for p in policies) else 0))
    fig_width = min(24.0, max(9.0, 1.4 * len(workloads) + 0.25 * n))
    fig, axes = plt.subplots(3, 1, figsize=(fig_width, 11), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    panels = (
        (axes[0], "output_tok_s", "output tokens/s (higher is better)"),
        (axes[1], "vs_fcfs", "throughput vs FCFS, x (higher is better)"),
        (axes[2], "ttft_p99_s", "TTFT p99, s, log (lower is better)"),
    )
    for ax, key, ylabel in panels:
        for i, p in enumerate(policies):
            offset = i + (1 if p in BOUNDS else 0)  # a gap before the bounds
            pos = x + (offset - (n - 1) / 2) * width
            ys = [value.get((w, p), {}).get(key) or 0.0 for w in workloads]
            bound = p in BOUNDS
            ax.bar(
                pos,
                ys,
                width,
                label=f"{p} (reference)" if bound else p,
                color=colors[i % len(colors)],
                hatch="//" if bound else None,
                edgecolor="black" if bound else None,
                linewidth=0.5,
                alpha=0.6 if bound else 1.0,
            )
        ax.set_xticks(x, [w if len(w) <= 28 else "..." + w[-25:] for w in workloads], rotation=15)
        ax.tick_params(axis="x", labelbottom=True)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[1].axhline(1.0, color="black", linewidth=0.9)
    if any((r.get("ttft_p99_s") or 0) > 0 for r in rows):
        axes[2].set_yscale("log")  # latencies span decades; bars start at the axis floor
    axes[0].legend(
        fontsize=8, ncol=min(len(policies), 6), loc="upper left", bbox_to_anchor=(0, 1.25)
    )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(rows: Sequence[dict], path: Path, title: str) -> Path:
    """A latency-throughput sweep (`feather bench --rates`): per workload, TTFT p99 and TPOT
    p99 (lower is better) against output tokens/s, one line per policy, a point per rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bases = list(dict.fromkeys(r["workload"].rsplit("@", 1)[0] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(2, len(bases), figsize=(max(6.0, 5.0 * len(bases)), 8), squeeze=False)
    for col, base in enumerate(bases):
        for row_i, (key, label) in enumerate(
            (("ttft_p99_s", "TTFT p99, s"), ("tpot_p99_s", "TPOT p99, s"))
        ):
            ax = axes[row_i][col]
            for p in policies:
                pts = sorted(
                    (r["rate_req_s"], r["output_tok_s"], r.get(key))
                    for r in rows
                    if r["policy"] == p
                    and r["workload"].rsplit("@", 1)[0] == base
                    and r.get(key) is not None
                )
                style = "--" if p in BOUNDS else "-"
                ax.plot([t for _, t, _ in pts], [v for _, _, v in pts], style, marker="o", label=p)
            ax.set_xlabel("output tokens/s (higher is better)", fontsize=9)
            ax.set_ylabel(f"{label} (lower is better)", fontsize=9)
            ax.grid(alpha=0.3)
            if row_i == 0:
                name = base if len(base) <= 40 else "..." + base[-37:]
                ax.set_title(name, fontsize=9)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
