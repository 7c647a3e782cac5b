"""A replay run as a bench row, and repeated runs against several servers as an A/B.

The row's fields are the bench's where they mean the same (`output_tok_s`, `ttft_p99_s`,
`tpot_p99_s`, `latency_p99_s`, `goodput_req_s`, `preemptions`, `vs_fcfs`: see
bench/columns.py), so `feather show` and `feather compare` read a replay record as they read
a bench record; the row's `policy` is the server's label. Percentiles are over the requests
that finished (TPOT per request: time after the first token over the tokens after it, as
vLLM's `bench serve`; ITL: every gap between streamed chunks). Throughput is over the span
from the first send to the last answer.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from feather_lab.replay.client import Outcome
from feather_lab.sim.result import SLO, percentiles

AB_METRICS = (
    ("output_tok_s", "higher"),
    ("total_tok_s", "higher"),
    ("goodput_req_s", "higher"),
    ("ttft_p50_s", "lower"),
    ("ttft_p99_s", "lower"),
    ("tpot_p50_s", "lower"),
    ("tpot_p99_s", "lower"),
    ("itl_p99_s", "lower"),
    ("latency_p50_s", "lower"),
    ("latency_p99_s", "lower"),
    ("failed", "lower"),
    ("server_prefix_hit_rate", "higher"),
    ("preemptions", "lower"),
)
"""The fields the A/B table reports B/A for, and which way is better."""


def _failures(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Failed requests by reason class (HTTP status, timeout, dropped stream, ...) and the
    ones never answered (the run was interrupted before they finished)."""
    failed = [o for o in outcomes if o.error is not None]
    reasons: dict[str, int] = {}
    for o in failed:
        key = f"http {o.status}" if o.error.startswith("HTTP") else o.error.split(":")[0]
        key = key.split(" after ")[0]
        reasons[key] = reasons.get(key, 0) + 1
    unanswered = sum(1 for o in outcomes if o.error is None and o.done_s is None)
    first = failed[0].error if failed else None
    return {"failed_by": reasons, "first_error": first, "unanswered": unanswered}


def _latencies(done: Sequence[Outcome]) -> dict[str, Any]:
    ttft = [o.chunk_s[0] - o.sent_s for o in done if o.chunk_s and o.sent_s is not None]
    e2e = [o.done_s - o.sent_s for o in done if o.sent_s is not None and o.done_s is not None]
    tpot = [
        (o.chunk_s[-1] - o.chunk_s[0]) / (o.tokens - 1)
        for o in done
        if o.tokens > 1 and len(o.chunk_s) > 1
    ]
    itl = [b - a for o in done for a, b in zip(o.chunk_s, o.chunk_s[1:])]
    return {
        **percentiles("ttft", ttft, 5),
        **percentiles("tpot", tpot, 5),
        **percentiles("itl", itl, 5),
        **percentiles("latency", e2e, 5),
    }


def _goodput(done: Sequence[Outcome], slo: SLO, span: float) -> float:
    """Requests/s that finished within the SLO (all finished ones without an SLO)."""
    good = 0
    for o in done:
        ttft = o.chunk_s[0] - o.sent_s if o.chunk_s and o.sent_s is not None else None
        tpot = (o.chunk_s[-1] - o.chunk_s[0]) / (o.tokens - 1) if o.tokens > 1 else None
        good += slo.within(ttft, tpot)
    return round(good / span, 4) if span > 0 else 0.0


def run_row(workload: str, label: str, outcomes: Sequence[Outcome], slo: SLO) -> dict[str, Any]:
    """One run's row: counts, throughput, latency percentiles, goodput, failures."""
    done = [o for o in outcomes if o.ok]
    sent = [o for o in outcomes if o.sent_s is not None]
    starts = [o.sent_s for o in sent if o.sent_s is not None]
    ends = [o.done_s for o in done if o.done_s is not None]
    span = max(ends) - min(starts) if ends and starts else 0.0
    out_tokens = sum(o.tokens for o in done)
    all_tokens = out_tokens + sum(o.prompt_tokens for o in done)
    lags = [o.sent_s - o.scheduled_s for o in sent if o.sent_s is not None]
    return {
        "workload": workload,
        "policy": label,
        "requests": len(outcomes),
        "sent": len(sent),
        "finished": len(done),
        "failed": sum(1 for o in outcomes if o.error is not None),
        "output_tokens": out_tokens,
        "makespan_s": round(span, 4),
        "output_tok_s": round(out_tokens / span, 2) if span > 0 else 0.0,
        "total_tok_s": round(all_tokens / span, 2) if span > 0 else 0.0,
        **_latencies(done),
        "goodput_req_s": _goodput(done, slo, span),
        "max_send_lag_s": round(max(lags), 4) if lags else None,
        **_failures(outcomes),
    }


def _median(values: list[Any]) -> Any:
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(nums) != len(values) or not nums:
        return values[-1] if values else None
    return round(statistics.median(nums), 5)


def median_row(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Repeated runs of one (workload, server) as one row: each number the median over the
    runs, every run's throughput kept (`output_tok_s_runs`) with its spread (max - min over
    the median)."""
    keys = [k for k in dict.fromkeys(k for r in runs for k in r) if k != "repeat"]
    row = {k: _median([r.get(k) for r in runs]) for k in keys}
    row["workload"], row["policy"] = runs[0]["workload"], runs[0]["policy"]
    tput = [r["output_tok_s"] for r in runs]
    row["repeats"] = len(runs)
    row["output_tok_s_runs"] = tput
    mid = statistics.median(tput)
    row["output_tok_s_spread"] = round((max(tput) - min(tput)) / mid, 4) if mid else None
    row["failed_by"] = _summed([r.get("failed_by") or {} for r in runs])
    row["runs_by_metric"] = {
        key: [r[key] for r in runs if isinstance(r.get(key), (int, float))] for key, _ in AB_METRICS
    }
    return row


def within_noise(a_runs: Sequence[float], b_runs: Sequence[float]) -> bool | None:
    """Whether B's difference from A is inside the run-to-run spread: the ranges of the two
    sides' runs overlap (pooled, neither side is apart from the other). None with fewer than
    two runs on a side: no spread to read it against."""
    if len(a_runs) < 2 or len(b_runs) < 2:
        return None
    return min(b_runs) <= max(a_runs) and min(a_runs) <= max(b_runs)


def _summed(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def ab_rows(rows: Sequence[dict[str, Any]], labels: Sequence[str]) -> list[dict[str, Any]]:
    """B/A per metric for each workload: every server against the first (A). Adds
    `vs_fcfs` (output tokens/s over A's, the bench's relative column) to `rows` in place."""
    table: list[dict[str, Any]] = []
    by_key = {(r["workload"], r["policy"]): r for r in rows}
    for r in rows:
        base = by_key.get((r["workload"], labels[0]))
        if base is None:
            continue
        a_tput = base.get("output_tok_s")
        r["vs_fcfs"] = round(r["output_tok_s"] / a_tput, 3) if a_tput else None
        if r["policy"] == labels[0]:
            continue
        for key, better in AB_METRICS:
            a, b = base.get(key), r.get(key)
            ratio = round(b / a, 3) if isinstance(a, (int, float)) and a and b is not None else None
            noise = within_noise(
                base.get("runs_by_metric", {}).get(key, []),
                r.get("runs_by_metric", {}).get(key, []),
            )
            table.append(
                {"workload": r["workload"], "a": labels[0], "b": r["policy"], "metric": key,
                 "a_value": a, "b_value": b, "b_over_a": ratio, "better": better,
                 "within_noise": noise}
            )  # fmt: skip
    return table
