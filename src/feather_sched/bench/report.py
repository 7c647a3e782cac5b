"""Tables and plots of `feather bench` rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

_COLUMNS = (
    ("output_tok_s", "out tok/s", "{:,.0f}"),
    ("vs_fcfs", "vs fcfs", "{:.2f}x"),
    ("mean_batch", "mean batch", "{:.1f}"),
    ("mean_prefix_groups", "prefix groups", "{:.1f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.2f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("sched_us_per_step", "sched us/step", "{:.1f}"),
    ("preemptions", "preempt", "{:d}"),
)


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


def _fmt(fmt: str, value) -> str:
    return "-" if value is None else fmt.format(value)


def results_table(rows: Sequence[dict], title: str) -> Table:
    """One row per (workload, policy); the best throughput per workload in bold."""
    table = Table(title=title, show_lines=False)
    table.add_column("workload", style="cyan")
    table.add_column("policy")
    for _, header, _ in _COLUMNS:
        table.add_column(header, justify="right")
    best = {}
    for r in rows:
        best[r["workload"]] = max(best.get(r["workload"], 0.0), r["output_tok_s"])
    last = None
    for r in rows:
        if last is not None and r["workload"] != last:
            table.add_section()
        last = r["workload"]
        cells = [_fmt(fmt, r.get(key)) for key, _, fmt in _COLUMNS]
        if r["output_tok_s"] == best[r["workload"]]:
            cells[0] = f"[bold green]{cells[0]}[/]"
        extra = f" (cap {r['oracle_cap']})" if "oracle_cap" in r else ""
        table.add_row(r["workload"], r["policy"] + extra, *cells)
    return table


def plot_results(rows: Sequence[dict], path: Path, title: str) -> Path:
    """Grouped bars: output tokens/s per workload and policy, absolute and relative to FCFS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    value = {(r["workload"], r["policy"]): r for r in rows}
    x = np.arange(len(workloads))
    width = 0.8 / max(1, len(policies))
    fig_width = min(24.0, max(9.0, 1.4 * len(workloads) + 0.25 * len(policies)))
    fig, axes = plt.subplots(2, 1, figsize=(fig_width, 8.5), sharex=True)
    for ax, key, ylabel in (
        (axes[0], "output_tok_s", "output tokens/s"),
        (axes[1], "vs_fcfs", "throughput vs FCFS (x)"),
    ):
        for i, p in enumerate(policies):
            ys = [value.get((w, p), {}).get(key) or 0.0 for w in workloads]
            ax.bar(x + (i - (len(policies) - 1) / 2) * width, ys, width, label=p)
        ax.set_xticks(x, workloads, rotation=15)
        ax.tick_params(axis="x", labelbottom=True)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].axhline(1.0, color="black", linewidth=0.8)
    axes[0].legend(
        fontsize=8, ncol=min(len(policies), 5), loc="upper left", bbox_to_anchor=(0, 1.18)
    )
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
