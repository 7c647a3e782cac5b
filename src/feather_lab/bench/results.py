"""Saved bench records: read one, show it (table, CSV, Markdown), compare two, list names.

A record is what `feather bench --json` writes: {"machine", "config", "rows"}. Rows are read
through `rows.Row` and shown in the columns `bench.columns` declares; a comparison pairs rows
with equal keys (workload and policy; replicas, seed and router where rows have them) and
gives B / A for every headline field the two share.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from feather_lab.bench.columns import Column, best_marks, columns_of
from feather_lab.bench.rows import (
    BLOCK_FIELDS,
    CLUSTER,
    Row,
    as_rows,
    baseline_of,
    blocks,
    kind_of,
)


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


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if not isinstance(v, (dict, list)):
                keys[k] = None
    return list(keys)


def rows_csv(rows: Sequence[Row | Mapping[str, Any]]) -> str:
    """Every scalar field of every row, one CSV line per row."""
    rows = [r.fields for r in as_rows(rows)]
    cols = _columns(rows)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: r.get(k) for k in cols})
    return buf.getvalue()


def headline(rows: Sequence[Row]) -> tuple[Column, ...]:
    """The headline columns of these rows' kind (`bench.columns`, the wide-only ones left
    out): what Markdown and `feather compare` show."""
    return columns_of(kind_of(rows), baseline_of(rows), wide=False)


def _block_fields(rows: Sequence[Row]) -> list[str]:
    return [k for k in BLOCK_FIELDS if any(r.fields.get(k) is not None for r in rows)]


def rows_markdown(rows: Sequence[Row | Mapping[str, Any]]) -> str:
    """A Markdown table of the headline columns, printed as the table prints them (units
    in the headers, the best row of each block marked as in the table)."""
    typed = as_rows(rows)
    ids = _block_fields(typed)
    cols = [c for c in headline(typed) if any(c.key in r.fields for r in typed)]
    first = "router/policy" if kind_of(typed) == CLUSTER else "policy"
    names = ["workload", *ids, first, *(c.title for c in cols)]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for block in blocks(typed):
        for r, mark in zip(block, best_marks(block, cols), strict=True):
            cells = [r.workload, *(_text(r.fields.get(k)) for k in ids), r.label + mark]
            cells += [c.text(r.fields.get(c.key)) for c in cols]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


ONLY_LISTED = 12
"""Rows without a counterpart named by `feather compare` (a count for the rest)."""


def _pairing(rows_a: Sequence[Row], rows_b: Sequence[Row]) -> list[str]:
    """The block fields (replicas, seed) that tell rows apart within a record: they pair
    rows too. One that is constant in each does not, so a 4-replica record compares with
    an 8-replica one router by router."""
    return [
        k
        for k in BLOCK_FIELDS
        if any(len({r.fields.get(k) for r in rows}) > 1 for rows in (rows_a, rows_b))
    ]


def _pair_key(row: Row, fields: Sequence[str]) -> tuple[Any, ...]:
    return (row.workload, *(row.fields.get(k) for k in fields), row.name)


def _pair_name(row: Row, fields: Sequence[str]) -> str:
    """`workload / name` in `feather compare`, with the pairing fields' values."""
    extra = "".join(f", {k} {row.fields.get(k)}" for k in fields)
    return f"{row.workload}{extra} / {row.name}"


def compare_rows(
    a: Sequence[Row | Mapping[str, Any]], b: Sequence[Row | Mapping[str, Any]]
) -> list[tuple[Row, dict[str, tuple[float, float, float | None]]]]:
    """For each row of B with a counterpart in A (same workload and name, and replicas and
    seed where a record holds several): B's row and, per headline field both have, A's
    value, B's value and B / A."""
    rows_a, rows_b = as_rows(a), as_rows(b)
    fields = _pairing(rows_a, rows_b)
    index_a = {_pair_key(r, fields): r for r in rows_a}
    cols = headline([*rows_a, *rows_b])
    out = []
    for rb in rows_b:
        ra = index_a.get(_pair_key(rb, fields))
        if ra is None:
            continue
        values = {}
        for c in cols:
            va, vb = ra.value(c.key), rb.value(c.key)
            if va is not None and vb is not None:
                values[c.key] = (va, vb, vb / va if va else None)
        out.append((rb, values))
    return out


def compare_text(
    a: Sequence[Row | Mapping[str, Any]],
    b: Sequence[Row | Mapping[str, Any]],
    name_a: str,
    name_b: str,
) -> str:
    """Side by side: per row in both, each headline field as A -> B (B/A), in the units
    the table prints."""
    rows_a, rows_b = as_rows(a), as_rows(b)
    pairs = compare_rows(rows_a, rows_b)
    if not pairs:
        return f"no (workload, policy) pair in common between {name_a} and {name_b}"
    cols = headline([*rows_a, *rows_b])
    fields = _pairing(rows_a, rows_b)
    higher = ", ".join(c.header for c in cols if c.better == "higher")
    lower = ", ".join(c.header for c in cols if c.better == "lower")
    lines = [
        f"A = {name_a}",
        f"B = {name_b}",
        f"ratio B/A (higher is better: {higher}; lower is better: {lower})",
    ]
    for row, values in pairs:
        lines.append(_pair_name(row, fields))
        for c in cols:
            if c.key in values:
                va, vb, ratio = values[c.key]
                r = "-" if ratio is None else f"{ratio:.3f}x"
                shown_a, shown_b = _text(va * c.scale), _text(vb * c.scale)
                lines.append(f"  {c.title:<16} {shown_a:>12} -> {shown_b:>12}  {r:>9}")
    both = {_pair_key(row, fields) for row, _ in pairs}
    for side, rows in (("A", rows_a), ("B", rows_b)):
        only = sorted({_pair_name(r, fields) for r in rows if _pair_key(r, fields) not in both})
        if only:
            more = f" and {len(only) - ONLY_LISTED} more" if len(only) > ONLY_LISTED else ""
            lines.append(f"only in {side}: {'; '.join(only[:ONLY_LISTED])}{more}")
    return "\n".join(lines)


POLICY_LINES = {
    "fcfs": "vLLM V1's and SGLang's default: queue order (the baseline)",
    "vllm-cache-aware": "vLLM 0.34's cache-aware window: head by cached tokens",
    "lpm": "SGLang longest prefix match (fcfs above 128 waiting)",
    "dfs-weight": "SGLang DFS over the prefix tree, heaviest subtree first",
    "hrrn": "SGLang highest response ratio next, token-based aging",
    "shortest-prefill-first": "SGLang's experimental shortest uncached prefill first",
    "lof": "SGLang longest output first",
    "random": "SGLang random order (seeded)",
    "max-homogeneous": "bound: one prefix group at a time",
    "grouped": "the CHT order Feather builds on: most shared chunks first",
    "feather": "Feather: grouped order, safe ADD/STOP bandit, cost prior",
    "feather-paper": "the authors' bandit, exactly as their code runs",
    "feather-upstream": "the authors' fixed rule sent to vLLM (PR #42134)",
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
    from feather_lab.bench.suite import BOUNDS, SUITE
    from feather_lab.workloads.registry import WORKLOADS
    from feather_sched.cost.profiles import list_hardware, list_models
    from feather_sched.policies.registry import policy_class, policy_names

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
