"""The policy table's verdicts and its page section, from a record of `vllm_table`.

Verdicts: `feather` against vLLM's cache-aware admission (the bar: >= `BAR` of its median
output tokens/s on every row), and, ending at EOS, that no policy changed a greedy output.
The page section sits between two markers in a Markdown page and is rewritten whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from feather_lab.bench.rows import by_workload

BAR = 0.98
"""`feather` >= BAR x `vllm-cache-aware` on every row (the medians' noise is a few percent)."""
BEGIN = "<!-- policy-table:begin -->"
END = "<!-- policy-table:end -->"
TARGET, RIVAL = "feather", "vllm-cache-aware"


def verdicts(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per workload label, `feather` / `vllm-cache-aware`; the labels below the bar; the
    labels where some policy's greedy outputs differed from vLLM's own."""
    ratio: dict[str, float] = {}
    differing: dict[str, int] = {}
    for label, policies in by_workload(rows).items():
        if TARGET in policies and RIVAL in policies and policies[RIVAL]["output_tok_s"]:
            ratio[label] = round(
                policies[TARGET]["output_tok_s"] / policies[RIVAL]["output_tok_s"], 3
            )
        worst = max((r.get("outputs_differing", 0) for r in policies.values()), default=0)
        if worst:
            differing[label] = worst
    return {
        "bar": BAR,
        "feather_vs_cache_aware": ratio,
        "below_bar": [label for label, r in ratio.items() if r < BAR],
        "outputs_differing": differing,
    }


def _spread(row: dict[str, Any]) -> str:
    runs = row.get("output_tok_s_runs") or [row["output_tok_s"]]
    return f"{min(runs):,.0f}-{max(runs):,.0f}"


def table_lines(rows: Sequence[dict[str, Any]], policies: Sequence[str]) -> list[str]:
    """The throughput table: median output tokens/s per policy (x vLLM's own), feather /
    cache-aware, and the spread of feather's and cache-aware's runs."""
    head = ["workload (KV, outputs)", *policies, "feather / cache-aware", "runs f / ca"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    ratio = verdicts(rows)["feather_vs_cache_aware"]
    for label, got in by_workload(rows).items():
        cells = [label]
        for p in policies:
            row = got.get(p)
            rel = row.get("vs_fcfs") if row else None
            cells.append(
                "-"
                if row is None
                else f"{row['output_tok_s']:,.0f}"
                + (f" ({rel:.2f}x)" if rel is not None and p != policies[0] else "")
            )
        r = ratio.get(label)
        cells.append("-" if r is None else (f"**{r:.3f}**" if r < BAR else f"{r:.3f}"))
        spreads = [_spread(got[p]) for p in (TARGET, RIVAL) if p in got]
        cells.append(" / ".join(spreads) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def eos_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Ending at EOS: the realised output lengths (the same under every policy: vLLM's own
    row), the most requests any run's greedy output differed in, and the most whose length
    was not the EOS rule's (harness/eos_walk.py)."""
    lines = [
        "| workload (KV, outputs) | cap (mean) | output quartiles (min, q1, median, q3, max) "
        "| mean | at the cap | requests | outputs differing | lengths off the rule |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for label, got in by_workload(rows).items():
        base = got.get("vllm")
        if base is None or base.get("ignore_eos", True):
            continue
        differing = max(r.get("outputs_differing", 0) for r in got.values())
        off = [r["output_len_off_rule"] for r in got.values() if "output_len_off_rule" in r]
        quart = ", ".join(str(q) for q in base["output_len_quartiles"])
        lines.append(
            f"| {label} | {base['output_len_cap_mean']:g} | {quart} | "
            f"{base['output_len_mean']:g} | {base['output_at_cap']} | {base['requests']} | "
            f"{differing} | {max(off) if off else '-'} |"
        )
    return lines


def section(record: dict[str, Any]) -> str:
    """The page section for a record: how it was made, both tables, the verdict."""
    rows, prov, machine = record["rows"], record["provenance"], record["machine"]
    policies = ["vllm", *record["config"]["policies"]]
    v = verdicts(rows)
    state = "" if record.get("complete") else " **(incomplete: the run stopped early)**"
    lines = [
        BEGIN,
        f"Record `{record.get('path', 'policy-table.json')}`{state}: {prov['date']}, commit "
        f"`{prov['commit']}`, {machine['cpu']} ({machine['cores']} cores), "
        f"command `{prov['command']}`. Median output tokens/s of "
        f"{record['config']['repeats']} interleaved runs (x vLLM's own scheduler, FCFS).",
        "",
        *table_lines(rows, policies),
        "",
        *eos_lines(rows),
        "",
        f"Verdict: `feather` >= {BAR} x `vllm-cache-aware` on "
        f"{len(v['feather_vs_cache_aware']) - len(v['below_bar'])} of "
        f"{len(v['feather_vs_cache_aware'])} rows"
        + (f"; below: {', '.join(v['below_bar'])}" if v["below_bar"] else "")
        + ". Greedy outputs "
        + (
            "identical under every policy on every EOS row."
            if not v["outputs_differing"]
            else f"DIFFER on {', '.join(v['outputs_differing'])}."
        ),
        END,
    ]
    return "\n".join(lines)


def write_section(page: Path, text: str) -> None:
    """Replace the page's section between the markers, or add it at the end."""
    old = page.read_text() if page.is_file() else ""
    if BEGIN in old and END in old:
        before, rest = old.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        page.write_text(before + text + after)
    else:
        page.write_text(old + ("\n" if old and not old.endswith("\n") else "") + text + "\n")
