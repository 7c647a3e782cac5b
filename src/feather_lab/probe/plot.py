"""The probe's plot: decode-step time against batch size, one panel per prefix length, one
line per prefix mix (one shared prefix, some, all distinct); measured points and the fitted
model's prediction (dashed). Needs matplotlib; without it, no plot (the results keep
everything to draw it later: `python -m feather_lab.probe.plot RESULTS.json OUT.png`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _mix(row: dict[str, Any]) -> str:
    if row["prefixes"] == 1:
        return "1 prefix"
    return "all distinct" if row["prefixes"] == row["batch"] else "some shared"


def plot_results(report: dict[str, Any], path: Path) -> str | None:
    """Write the plot to `path`; its path, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    kernel = report["config"]["fitted_kernel"]
    rows = [r for r in report["rows"] if r["kernel"] == kernel]
    plens = sorted({r["prefix_len"] for r in rows})
    fig, axes = plt.subplots(1, len(plens), figsize=(4.2 * len(plens), 3.8), squeeze=False)
    colors = {"1 prefix": "tab:green", "some shared": "tab:orange", "all distinct": "tab:red"}
    for ax, plen in zip(axes[0], plens):
        for mix, color in colors.items():
            pts = sorted(
                (r for r in rows if r["prefix_len"] == plen and _mix(r) == mix),
                key=lambda r: r["batch"],
            )
            if not pts:
                continue
            xs = [r["batch"] for r in pts]
            ax.plot(xs, [r["decode_ms"] for r in pts], "o-", color=color, label=mix)
            if "predicted_ms" in pts[0]:
                ax.plot(xs, [r["predicted_ms"] for r in pts], "--", color=color, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"prefix {plen} tokens")
        ax.set_xlabel("batch (requests)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("decode step (ms)")
    axes[0][0].legend(fontsize=8)
    dev = report["device"]
    mape = report.get("heldout_mape")
    fig.suptitle(
        f"feather probe: {report['config']['model']} on {dev.get('name')} ({kernel}); "
        f"dashed: fitted model" + (f", held-out MAPE {mape:.1%}" if mape is not None else ""),
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m feather_lab.probe.plot RESULTS.json OUT.png")
    print(plot_results(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])))
