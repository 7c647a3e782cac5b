"""The paper's effect on vLLM's CPU kernels: decode tokens/s against batch size, one line per
number of distinct prefixes, from a `feather calibrate --engine vllm --model kv-bound` report
(its "decode" samples: the median decode step of each composition). Prints the step table too.
Usage:
  python benchmarks/vllm/kv_bound_plot.py benchmarks/vllm/kv-bound-calibrate.json \
      --prefix 2048 --plot benchmarks/vllm/kv-bound-decode.png
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

LABEL = re.compile(r"B(\d+)-G(\d+)-P(\d+)-S(\d+)(-grouped)?$")


def decode_points(report: dict, prefix: int) -> list[dict]:
    """(batch, prefixes, grouped, ms, tok/s) of every decode sample at `prefix` tokens."""
    out = []
    for s in report["decode"]:
        m = LABEL.match(s["composition"])
        if not m or int(m.group(3)) != prefix:
            continue
        batch, groups = int(m.group(1)), int(m.group(2))
        ms = float(s["measured_ms"])
        out.append(
            {
                "batch": batch,
                "prefixes": groups,
                "grouped": bool(m.group(5)) or groups == 1,
                "ms": ms,
                "tok_s": batch / ms * 1e3,
                "predicted_ms": s.get("predicted_ms"),
            }
        )
    return sorted(out, key=lambda p: (p["prefixes"], p["grouped"], p["batch"]))


def plot(points: list[dict], path: Path, prefix: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    series: dict[tuple[int, bool], list[dict]] = {}
    for p in points:
        series.setdefault((p["prefixes"], p["grouped"]), []).append(p)
    for (groups, grouped), pts in sorted(series.items()):
        label = f"{groups} prefix" + ("es" if groups > 1 else "")
        if groups > 1:
            label += ", adjacent" if grouped else ", interleaved"
        ax.plot(
            [p["batch"] for p in pts],
            [p["tok_s"] for p in pts],
            marker="o",
            linestyle="-" if grouped else "--",
            label=label,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (sequences decoding)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"vLLM CPU, kv-bound model, {prefix}-token prefixes")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("report")
    parser.add_argument("--prefix", type=int, default=2048)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    points = decode_points(json.loads(Path(args.report).read_text()), args.prefix)
    print("| batch | prefixes | order | decode step ms | tok/s | model ms |")
    print("|---:|---:|---|---:|---:|---:|")
    for p in sorted(points, key=lambda p: (p["batch"], p["prefixes"], p["grouped"])):
        order = "adjacent" if p["grouped"] else "interleaved"
        print(
            f"| {p['batch']} | {p['prefixes']} | {order} | {p['ms']:.1f} | {p['tok_s']:.0f} "
            f"| {p['predicted_ms']:.1f} |"
        )
    if args.plot:
        plot(points, Path(args.plot), args.prefix)


if __name__ == "__main__":
    main()
