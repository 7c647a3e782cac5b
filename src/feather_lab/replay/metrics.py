"""The server's own view of a run, from its Prometheus `/metrics` (vLLM exposes it; SGLang
with `--enable-metrics`): counters scraped before and after the run, their differences
reported, and the queue gauges sampled during it. A server without the endpoint, or without
some of the metrics, gives fewer fields, never an error.

Each field reads vLLM 0.32's metric (vllm/v1/metrics/loggers.py; prometheus_client adds
`_total` to counters) or, where that is absent, SGLang 0.5's (`sglang:` prefix,
srt/observability/metrics_collector.py): prefix-cache queries and hits in tokens (SGLang:
prompt tokens, and cached prompt tokens summed over its cache sources), preemptions (SGLang:
retracted requests), requests finished (SGLang: requests processed), requests running and
waiting (SGLang: running and queued), and vLLM's engine iterations.
"""

from __future__ import annotations

import asyncio
import statistics

import httpx

COUNTERS = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "sglang:prompt_tokens_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "sglang:cached_tokens_total"),
    "preemptions": ("vllm:num_preemptions_total", "sglang:num_retracted_requests_total"),
    "requests_succeeded": ("vllm:request_success_total", "sglang:num_requests_total"),
    "iterations": ("vllm:iteration_tokens_total_count",),
    "iteration_tokens": ("vllm:iteration_tokens_total_sum",),
    "feather_decisions": ("feather_decisions_total",),
    "feather_stops": ("feather_decisions_total:stop",),
    "feather_kv_gate_holds": ("feather_kv_gate_holds_total",),
    "feather_engine_order_steps": ("feather_engine_order_steps_total",),
    "feather_batches": ("feather_batch_prefix_groups_count",),
    "feather_batch_prefix_groups": ("feather_batch_prefix_groups_sum",),
}
"""Row field -> the counters (vLLM's, SGLang's) whose increase over the run it is. vLLM
only: engine iterations and the tokens they computed (prompt and generated), the count and
sum of its per-iteration token histogram, so two servers' runs of one workload can be
compared step for step. Feather's server only (host/metrics.py): its ADD/STOP decisions and
STOPs, KV-gate holds, steps left to the engine's order, and the scheduled batches with their
prefix groups (the row's `server_feather_prefix_groups_per_batch` is their mean). A
labelled series is read summed over its labels, or one label value as `name:value`."""
GAUGES = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
}
"""Row field stem -> the gauges sampled during the run (`<stem>_mean`, `<stem>_max`)."""


def _first(found: dict[str, float], names: tuple[str, ...]) -> str | None:
    """The first of `names` the server exposes."""
    return next((n for n in names if n in found), None)


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
        label = name_part.partition('="')[2].rstrip('"') if "{" in line else ""
        if label and "," not in name_part:  # a one-label series, also by its value
            out[f"{name}:{label}"] = value
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
            names = {k: _first(found, ms) for k, ms in GAUGES.items()}
            into.append({k: found[m] for k, m in names.items() if m is not None})
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
        for key, names in COUNTERS.items():
            name = _first(after, names)
            if name is not None and (name in before or name.startswith("feather_")):
                # Feather's series appear once its engine first wrote: absent is zero then
                out[f"server_{key}"] = after[name] - before.get(name, 0.0)
        queries = out.get("server_prefix_cache_queries")
        if queries:
            out["server_prefix_hit_rate"] = round(out["server_prefix_cache_hits"] / queries, 4)
        batches = out.get("server_feather_batches")
        if batches:
            groups = out["server_feather_batch_prefix_groups"] / batches
            out["server_feather_prefix_groups_per_batch"] = round(groups, 3)
    for key in GAUGES:
        values = [s[key] for s in samples if key in s]
        if values:
            out[f"server_{key}_mean"] = round(statistics.fmean(values), 2)
            out[f"server_{key}_max"] = max(values)
    return out
