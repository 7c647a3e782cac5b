"""A `feather bench --engine vllm` JSON as a markdown table with paired ratios.

The machine is noisy (one run varies by +-25%), so besides the ratio of medians each policy's
row gives the median and range of its paired ratios: run i of the policy over run i of vLLM's
own scheduler, which ran just before it in the same repetition.
Usage: python benchmarks/feather/paired_table.py benchmarks/vllm/bench.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from feather_lab.results.tables import paired_ratios

BASELINE = "vllm"
HEADER = (
    "| workload | policy | out tok/s (runs) | vs vLLM | paired ratio: median (range) "
    "| mean batch | STOPs / decisions | forced | preempt (max/request) |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|"
)


def _row(r: dict, base: dict) -> str:
    runs = ", ".join(f"{x:,.0f}" for x in r["output_tok_s_runs"])
    ratio, paired = "1.00x", "-"
    if r["policy"] != BASELINE:
        pairs = paired_ratios(r, base)
        ratio = f"{r['output_tok_s'] / base['output_tok_s']:.2f}x"
        paired = f"{statistics.median(pairs):.2f} ({min(pairs):.2f}-{max(pairs):.2f})"
    decisions = f"{r['policy_stops']} / {r['policy_decisions']}" if "policy_decisions" in r else "-"
    return (
        f"| {r['workload']} | {r['policy']} | {r['output_tok_s']:,.0f} ({runs}) | {ratio} "
        f"| {paired} | {r['mean_batch']} | {decisions} "
        f"| {r.get('forced_admissions', '-')} "
        f"| {r['preemptions']} ({r.get('preempt_max', '-')}) |"
    )


def table(rows: list[dict]) -> str:
    base = {r["workload"]: r for r in rows if r["policy"] == BASELINE}
    return "\n".join([HEADER, *(_row(r, base[r["workload"]]) for r in rows)])


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())["rows"]))
