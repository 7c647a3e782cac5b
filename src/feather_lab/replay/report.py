"""How a replay is reported beside the bench's own table: the A/B table (B/A per metric,
with each side's run-to-run spread) and the record's config."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from feather_lab.bench.columns import Column

_AUTO = Column("value", "value", "")


def _value(v: Any) -> str:
    return _AUTO.text(v)


def ab_text(ab: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> str:
    """One block per (workload, B): each metric's A and B medians, B/A, and whether B/A is
    within noise (the two sides' runs overlap); the title gives each side's throughput
    over its runs (the spread a B/A should be read against)."""
    runs = {(r["workload"], r["policy"]): r.get("output_tok_s_runs") for r in rows}
    lines: list[str] = []
    current = None
    for e in ab:
        key = (e["workload"], e["b"])
        if key != current:
            current = key
            a_runs, b_runs = runs.get((e["workload"], e["a"])), runs.get(key)
            lines += ["", f"{e['workload']}: {e['b']} / {e['a']}  (output tok/s by run: "
                      f"{e['a']} {a_runs}, {e['b']} {b_runs})"]  # fmt: skip
            lines.append(f"  {'metric':<24} {e['a']:>10} {e['b']:>10} {'B/A':>7}  better  noise")
        ratio = "-" if e["b_over_a"] is None else f"{e['b_over_a']:.3f}"
        lines.append(
            f"  {e['metric']:<24} {_value(e['a_value']):>10} {_value(e['b_value']):>10} "
            f"{ratio:>7}  {e['better']:<6}  {NOISE[e.get('within_noise')]}"
        )
    if any(e.get("within_noise") is None for e in ab):
        lines += ["", "noise: '-' where a side has one run: --repeats 3 or more to read B/A "
                  "against the run-to-run spread"]  # fmt: skip
    return "\n".join(lines)


NOISE = {True: "within noise", False: "outside noise", None: "-"}
"""How a B/A reads against the runs' spread (`summary.within_noise`)."""


def spread_text(rows: Sequence[dict[str, Any]]) -> str:
    """Each row's run-to-run spread of output throughput (max - min over the median): what
    a difference between two servers has to exceed to be more than noise."""
    parts = []
    for r in rows:
        spread = r.get("output_tok_s_spread")
        runs = r.get("repeats", 1)
        text = "one run, no spread" if runs < 2 or spread is None else f"{spread:.1%}"
        parts.append(f"  {r['workload']} on {r['policy']}: {text} ({runs} runs)")
    return "\n".join(["output tok/s spread over runs (max - min) / median:", *parts])


def server_table(text: str) -> str:
    """The bench's table with its columns named for what a replay's rows are: servers (the
    bench's `policy`) and output throughput over server A's (the bench's `xfcfs`); the same
    widths, so the columns stay aligned."""
    title, _, rest = text.partition("\n")
    header, _, body = rest.partition("\n")
    return "\n".join(
        [title, header.replace("policy", "server", 1).replace("xfcfs", "  x A", 1), body]
    )


def replay_config(
    opts: dict[str, Any], labels: Sequence[str], endpoints: Sequence[Any]
) -> dict[str, Any]:
    """What the record says it ran: the servers (label, URL, served model, context), the
    workload and client options as given."""
    keys = (
        "model", "vocab_size", "seed", "arrival", "rate_scale", "rates", "limit",
        "drop_overlong", "slo_ttft", "slo_tpot", "max_concurrency", "request_timeout",
        "repeats", "scenario", "reset_prefix_cache", "stream_interval", "api", "max_failed",
        "dataset_name", "num_prompts", "burstiness", "random_input_len", "random_output_len",
        "random_range_ratio", "random_prefix_len", "prefix_repetition_prefix_len",
        "prefix_repetition_suffix_len", "prefix_repetition_num_prefixes",
        "prefix_repetition_output_len", "percentile_metrics", "metric_percentiles", "aa",
    )  # fmt: skip
    servers = [
        {"label": lb, "url": e.url, "served_model": e.model, "max_model_len": e.max_model_len}
        for lb, e in zip(labels, endpoints)
    ]
    return {
        "engine": "replay",
        "workloads": [w.strip() for item in opts["workload"] or [] for w in item.split(",")],
        "servers": servers,
        "request_rate": str(opts.get("request_rate")),  # inf is not JSON
        **{k: opts.get(k) for k in keys},
    }
