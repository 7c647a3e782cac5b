"""Tables and plots of `feather bench` rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from feather_lab.bench.columns import Column, column, columns_of
from feather_lab.bench.rows import BLOCK_FIELDS, Row, as_rows, baseline_of, kind_of


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


def _axis_label(col: Column, log: bool = False) -> str:
    """A panel's y label from the column's declaration: what, unit, which way is better."""
    unit = "x" if col.key.startswith("vs_") else col.unit
    parts = [col.description, *([unit] if unit else []), *(["log"] if log else [])]
    return ", ".join(parts) + (f" ({col.better} is better)" if col.better else "")


def plot_results(rows: Sequence[Row | Mapping[str, Any]], path: Path, title: str) -> Path:
    """A panel per plotted column (`Column.plot`: output tokens/s, throughput relative to
    the baseline with a 1.0 line, TTFT p99 on a log axis), a bar group per block and a bar
    per row name (policy, or router/policy on a cluster). Bounds are hatched and set apart
    at the right of each group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    typed = as_rows(rows)
    kind, baseline = kind_of(typed), baseline_of(typed)
    panels = [c for c in columns_of(kind, baseline) if c.plot]
    groups = list(dict.fromkeys(_group_name(r) for r in typed))
    seen = list(dict.fromkeys(r.name for r in typed))
    names = [p for p in seen if p not in BOUNDS] + [p for p in seen if p in BOUNDS]
    value = {(_group_name(r), r.name): r for r in typed}
    n = max(1, len(names))
    fig_width = min(24.0, max(9.0, 1.4 * len(groups) + 0.25 * n))
    fig, axes = plt.subplots(len(panels), 1, figsize=(fig_width, 11), sharex=True)
    for ax, col in zip(axes, panels, strict=True):
        ys = {
            name: [value[g, name].value(col.key) if (g, name) in value else None for g in groups]
            for name in names
        }
        _bars(ax, groups, names, ys)
        log = col.better == "lower" and any((v or 0) > 0 for vs in ys.values() for v in vs)
        if log:
            ax.set_yscale("log")  # latencies span decades; bars start at the axis floor
        if col.key.startswith("vs_"):
            ax.axhline(1.0, color="black", linewidth=0.9)
        ax.set_ylabel(_axis_label(col, log), fontsize=9)
    axes[0].legend(fontsize=8, ncol=min(n, 6), loc="upper left", bbox_to_anchor=(0, 1.25))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _group_name(row: Row) -> str:
    """A bar group's label: the workload, with the replicas and seed where rows have them."""
    extra = [f"{k} {v}" for k, v in zip(BLOCK_FIELDS, row.block[1:], strict=True) if v is not None]
    return row.workload + (f" ({', '.join(extra)})" if extra else "")


def _bars(ax: Any, groups: list[str], names: list[str], ys: dict[str, list]) -> None:
    """One panel's bars: a group per block, a bar per name (bounds hatched, after a gap)."""
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(groups))
    n = max(1, len(names))
    width = 0.8 / (n + (1 if any(p in BOUNDS for p in names) else 0))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, p in enumerate(names):
        bound = p in BOUNDS
        offset = i + (1 if bound else 0)  # a gap before the bounds
        ax.bar(
            x + (offset - (n - 1) / 2) * width,
            [v or 0.0 for v in ys[p]],
            width,
            label=f"{p} (reference)" if bound else p,
            color=colors[i % len(colors)],
            hatch="//" if bound else None,
            edgecolor="black" if bound else None,
            linewidth=0.5,
            alpha=0.6 if bound else 1.0,
        )
    ax.set_xticks(x, [w if len(w) <= 28 else "..." + w[-25:] for w in groups], rotation=15)
    ax.tick_params(axis="x", labelbottom=True)
    ax.grid(axis="y", alpha=0.3)


SWEEP_PANELS = ("ttft_p99_s", "tpot_p99_s")
"""The latencies a sweep plots against throughput, in their columns' units."""


def plot_sweep(rows: Sequence[dict], path: Path, title: str) -> Path:
    """A latency-throughput sweep (`feather bench --rates`): per workload, TTFT p99 and TPOT
    p99 (lower is better) against output tokens/s, one line per policy, a point per rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bases = list(dict.fromkeys(r["workload"].rsplit("@", 1)[0] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(2, len(bases), figsize=(max(6.0, 5.0 * len(bases)), 8), squeeze=False)
    for i, base in enumerate(bases):
        for row_i, key in enumerate(SWEEP_PANELS):
            col = column(key)
            ax = axes[row_i][i]
            for p in policies:
                pts = sorted(
                    (r["rate_req_s"], r["output_tok_s"], r.get(key) * col.scale)
                    for r in rows
                    if r["policy"] == p
                    and r["workload"].rsplit("@", 1)[0] == base
                    and r.get(key) is not None
                )
                style = "--" if p in BOUNDS else "-"
                ax.plot([t for _, t, _ in pts], [v for _, _, v in pts], style, marker="o", label=p)
            ax.set_xlabel(_axis_label(column("output_tok_s")), fontsize=9)
            ax.set_ylabel(_axis_label(col), fontsize=9)
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
