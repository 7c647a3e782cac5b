"""A replay run's result fields as vLLM's own client (`vllm bench serve`,
vllm/benchmarks/serve.py) writes them, so the two records compare line by line:
`completed`, `failed`, `duration`, `total_input_tokens`, `total_output_tokens`,
`request_throughput`, `output_throughput`, `total_token_throughput`, and for each metric of
`--percentile-metrics` (ttft, tpot, itl, e2el) `mean_<m>_ms`, `median_<m>_ms`, `std_<m>_ms`
and `p<P>_<m>_ms` for each of `--metric-percentiles`. Definitions are vLLM's: TPOT per
request is (E2EL - TTFT) / (output tokens - 1); ITL every gap between streamed chunks;
duration from the run's start, before its first send (as vLLM's `benchmark_start_time`), to
the last answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from feather_lab.replay.client import Outcome

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_METRICS = ("ttft", "tpot", "itl")
"""vLLM's default for generative models."""


def parse_metrics(text: str | None) -> tuple[str, ...]:
    """`--percentile-metrics`, checked: a ValueError names a metric that is not vLLM's."""
    if not text:
        return DEFAULT_METRICS
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in names if m not in PERCENTILE_METRICS]
    if bad or not names:
        raise ValueError(f"--percentile-metrics {text!r}: valid: {', '.join(PERCENTILE_METRICS)}")
    return names


def parse_percentiles(text: str) -> tuple[float, ...]:
    """`--metric-percentiles` (e.g. "50,90,99"), each in (0, 100]."""
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not 0 < p <= 100 for p in values):
        raise ValueError(f"--metric-percentiles {text!r}: comma-separated numbers in (0, 100]")
    return values


def _series(done: Sequence[Outcome]) -> dict[str, list[float]]:
    ttft, tpot, e2el, itl = [], [], [], []
    for o in done:
        if o.sent_s is None or o.done_s is None or not o.chunk_s:
            continue
        first, total = o.chunk_s[0] - o.sent_s, o.done_s - o.sent_s
        ttft.append(first)
        e2el.append(total)
        if o.tokens > 1:
            tpot.append((total - first) / (o.tokens - 1))
        itl += [b - a for a, b in zip(o.chunk_s, o.chunk_s[1:])]
    return {"ttft": ttft, "tpot": tpot, "itl": itl, "e2el": e2el}


def vllm_fields(
    outcomes: Sequence[Outcome],
    metrics: Sequence[str] = DEFAULT_METRICS,
    percentiles: Sequence[float] = (99.0,),
) -> dict[str, Any]:
    """The run's fields under vLLM's names (the module doc)."""
    done = [o for o in outcomes if o.ok]
    ends = [o.done_s for o in done if o.done_s is not None]
    duration = max(ends) if ends else 0.0  # outcome times count from the run's start
    inputs, outputs = sum(o.prompt_tokens for o in done), sum(o.tokens for o in done)
    per_s = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)
    out: dict[str, Any] = {
        "completed": len(done),
        "failed": len(outcomes) - len(done),
        "duration": duration,
        "total_input_tokens": inputs,
        "total_output_tokens": outputs,
        "request_throughput": per_s(len(done)),
        "output_throughput": per_s(outputs),
        "total_token_throughput": per_s(inputs + outputs),
    }
    series = _series(done)
    for m in metrics:
        ms = np.asarray(series[m], dtype=float) * 1000.0
        empty = ms.size == 0
        out[f"mean_{m}_ms"] = 0.0 if empty else float(ms.mean())
        out[f"median_{m}_ms"] = 0.0 if empty else float(np.median(ms))
        out[f"std_{m}_ms"] = 0.0 if empty else float(ms.std())
        for p in percentiles:
            key = f"p{int(p) if float(p).is_integer() else p}_{m}_ms"
            out[key] = 0.0 if empty else float(np.percentile(ms, p))
    return out
