"""The server's own view of a run, from its Prometheus `/metrics` (vLLM exposes it; SGLang
with `--enable-metrics`): counters scraped before and after the run, their differences
reported, and the queue gauges sampled during it. A server without the endpoint, or without
some of the metrics, gives fewer fields, never an error.

vLLM 0.32's names (vllm/v1/metrics/loggers.py; prometheus_client adds `_total` to
counters): prefix-cache queries and hits (tokens), preemptions, requests finished, requests
running and waiting.
SGLang's (`sglang:` prefix) differ and are not mapped here: its rows carry the client's
measurements only.
"""

from __future__ import annotations

import asyncio
import statistics

import httpx

COUNTERS = {
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
    "requests_succeeded": "vllm:request_success_total",
}
"""Row field -> the counter whose increase over the run it is."""
GAUGES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
}
"""Row field stem -> the gauge sampled during the run (`<stem>_mean`, `<stem>_max`)."""


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {metric name: value summed over its label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.partition(" ") if "{" not in line else line.partition("}")
        name = name_part.split("{", 1)[0].strip()
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + value
    return out


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float] | None:
    """The server's metrics now; None when it has no `/metrics` (or it failed)."""
    try:
        resp = await client.get(url + "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    return parse_metrics(resp.text) if resp.status_code == 200 else None


async def sample_gauges(
    client: httpx.AsyncClient, url: str, interval_s: float, into: list[dict[str, float]]
) -> None:
    """`GAUGES` read every `interval_s` into `into` until cancelled."""
    while True:
        found = await scrape(client, url)
        if found is not None:
            into.append({k: found[m] for k, m in GAUGES.items() if m in found})
        await asyncio.sleep(interval_s)


def metric_fields(
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    samples: list[dict[str, float]],
) -> dict[str, float]:
    """The row's server-side fields: each counter's increase, the prefix-cache hit rate
    over the run (hits / queries, in tokens), the gauges' mean and max while it ran."""
    out: dict[str, float] = {}
    if before is not None and after is not None:
        for key, name in COUNTERS.items():
            if name in before and name in after:
                out[f"server_{key}"] = after[name] - before[name]
        queries = out.get("server_prefix_cache_queries")
        if queries:
            out["server_prefix_hit_rate"] = round(out["server_prefix_cache_hits"] / queries, 4)
    for key in GAUGES:
        values = [s[key] for s in samples if key in s]
        if values:
            out[f"server_{key}_mean"] = round(statistics.fmean(values), 2)
            out[f"server_{key}_max"] = max(values)
    return out
