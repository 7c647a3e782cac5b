"""Saved bench records: read one, show it (table, CSV, Markdown), compare two, list names.

A record is what `feather bench --json` writes: {"machine", "config", "rows"}. Rows are keyed
by (workload, policy); a comparison pairs equal keys and gives B / A for every numeric field
the two share (the headline ones first).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HEADLINE = (
    "output_tok_s",
    "vs_fcfs",
    "mean_batch",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p99_s",
    "latency_p99_s",
    "goodput_req_s",
)
HIGHER_IS_BETTER = {"output_tok_s", "vs_fcfs", "goodput_req_s", "prefix_hit_rate"}


def read_record(path: Path) -> dict[str, Any]:
    """A bench record, or ValueError naming the file and what is wrong with it."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file (expected a `feather bench --json` record)")
    try:
        payload = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    rows = payload.get("rows") if isinstance(payload, dict) else None
    if not isinstance(rows, list) or not all(
        isinstance(r, dict) and "workload" in r and "policy" in r for r in rows
    ):
        raise ValueError(
            f"{path}: not a bench record (needs a list 'rows' of objects with workload, policy)"
        )
    return payload


def _columns(rows: Sequence[dict]) -> list[str]:
    keys: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if not isinstance(v, (dict, list)):
                keys[k] = None
    return list(keys)


def rows_csv(rows: Sequence[dict]) -> str:
    """Every scalar field of every row, one CSV line per row."""
    cols = _columns(rows)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: r.get(k) for k in cols})
    return buf.getvalue()


def rows_markdown(rows: Sequence[dict], fields: Sequence[str] = HEADLINE) -> str:
    """A Markdown table of the headline fields."""
    cols = ["workload", "policy", *[f for f in fields if any(f in r for r in rows)]]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_text(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def _text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def compare_rows(a: Sequence[dict], b: Sequence[dict]) -> list[dict[str, Any]]:
    """For each (workload, policy) in both: A's and B's headline values and B / A."""
    index_a = {(r["workload"], r["policy"]): r for r in a}
    out = []
    for rb in b:
        key = (rb["workload"], rb["policy"])
        ra = index_a.get(key)
        if ra is None:
            continue
        entry: dict[str, Any] = {"workload": key[0], "policy": key[1]}
        for f in HEADLINE:
            va, vb = ra.get(f), rb.get(f)
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
                entry[f] = (va, vb, vb / va if va else None)
        out.append(entry)
    return out


def compare_text(a: Sequence[dict], b: Sequence[dict], name_a: str, name_b: str) -> str:
    """Side by side: per (workload, policy), each headline field as A -> B (B/A)."""
    pairs = compare_rows(a, b)
    if not pairs:
        return f"no (workload, policy) pair in common between {name_a} and {name_b}"
    lines = [
        f"A = {name_a}",
        f"B = {name_b}",
        "ratio B/A (tok/s, goodput: higher is better; latencies: lower is better)",
    ]
    for p in pairs:
        lines.append(f"{p['workload']} / {p['policy']}")
        for f in HEADLINE:
            if f in p:
                va, vb, ratio = p[f]
                r = "-" if ratio is None else f"{ratio:.3f}x"
                lines.append(f"  {f:<16} {_text(va):>12} -> {_text(vb):>12}  {r:>9}")
    both = {(p["workload"], p["policy"]) for p in pairs}
    only_a = {(r["workload"], r["policy"]) for r in a} - both
    only_b = {(r["workload"], r["policy"]) for r in b} - both
    if only_a:
        lines.append(f"only in A: {', '.join(f'{w} / {p}' for w, p in sorted(only_a))}")
    if only_b:
        lines.append(f"only in B: {', '.join(f'{w} / {p}' for w, p in sorted(only_b))}")
    return "\n".join(lines)


POLICY_LINES = {
    "fcfs": "vLLM V1's and SGLang's default: queue order (the baseline)",
    "lpm": "SGLang longest prefix match (fcfs above 128 waiting)",
    "dfs-weight": "SGLang DFS over the prefix tree, heaviest subtree first",
    "hrrn": "SGLang highest response ratio next, token-based aging",
    "shortest-prefill-first": "SGLang's experimental shortest uncached prefill first",
    "lof": "SGLang longest output first",
    "random": "SGLang random order (seeded)",
    "max-homogeneous": "bound: one prefix group at a time",
    "grouped": "the CHT order Feather builds on: most shared chunks first",
    "feather": "Feather: grouped order, safe ADD/STOP bandit, cost prior",
    "feather-paper": "the paper's bandit as published (comparison row)",
    "feather-ppo": "Feather's decisions by a small PPO-trained MLP",
}


def _describe(name: str, p: Any) -> str:
    o = p.overrides
    if name.startswith("paper-") or name == "long-context":
        label = "paper" if name.startswith("paper-") else "KV-bound sessions"
        return (
            f"{label}: {o['num_prefixes']} x {o['requests_per_prefix']}, "
            f"{o['prefix_len'] // 1000}-{o['prefix_len_max'] // 1000}k prefixes, {o['arrival']}"
        )
    if not o:
        return f"the {p.base} generator's defaults"
    return f"{p.base}: " + ", ".join(f"{k}={v}" for k, v in o.items())


def catalogue() -> dict[str, list[tuple[str, str]]]:
    """What `feather list` prints: every name the bench takes, with a line each."""
    from feather_sched.bench.suite import BOUNDS, SUITE
    from feather_sched.cost.profiles import list_hardware, list_models
    from feather_sched.policies.registry import policy_class, policy_names
    from feather_sched.workloads.registry import WORKLOADS

    def first_line(obj: Any) -> str:
        doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
        return doc[0] if doc else ""

    policies = []
    for name in policy_names():
        line = POLICY_LINES.get(name)
        if line is None:
            try:
                line = first_line(policy_class(name))
            except Exception:  # a plugin policy whose module cannot import here
                line = "(not importable here)"
        if name in BOUNDS and not line.startswith("bound"):
            line = "bound: " + line
        policies.append((name, line))
    policies.append(("oracle", "reference: best fixed batch cap of grouped (beatable)"))
    workloads = [(name, _describe(name, p)) for name, p in SUITE.items()]
    workloads += [
        (name, f"the {name} generator's defaults") for name in WORKLOADS if name not in SUITE
    ]
    workloads.append(("trace:PATH", "a Mooncake or feather JSONL trace file"))
    return {
        "policies": policies,
        "workloads": workloads,
        "hardware": [(n, _hardware_line(n)) for n in list_hardware()]
        + [("PATH.json", "a profile file (an estimate unless it says `provenance`)")],
        "models": [(n, "") for n in list_models()] + [("PATH.json", "a profile file")],
    }


def _hardware_line(name: str) -> str:
    """A built-in hardware profile's provenance and what it is, for `feather list`."""
    from feather_sched.cost.profiles import load_hardware

    hw = load_hardware(name)
    what = hw.description.split(";")[0].split(",")[0]
    line = f"{hw.provenance:<8}  {what}"
    return line if len(line) <= 58 else line[:57] + "…"
