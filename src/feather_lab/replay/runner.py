"""Replay runs: one workload against one server (the schedule, the metrics around it), and
the A/B: every workload against every server, `repeats` times, interleaved (the servers'
order alternates between repeats, so a slow spell of a shared machine or a warming server
does not land on one side), then medians per (workload, server).

Before each run the server's prefix cache is emptied where it allows it (vLLM's
`POST /reset_prefix_cache`, served with VLLM_SERVER_DEV_MODE=1; SGLang's `POST /flush_cache`),
so every run starts cold as the in-process bench's do; the row says whether it was
(`prefix_cache_reset`). The row also carries the client's own CPU seconds over the run
(`client_cpu_s`: this process's, the HTTP client and the metrics sampler) and the library
its requests went through (`http_client`, replay/transport.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from feather_lab.replay.client import ClientOptions, Endpoint, Outcome, run_schedule
from feather_lab.replay.metrics import metric_fields, sample_gauges, scrape
from feather_lab.replay.summary import ab_rows, median_row, run_row
from feather_lab.replay.transport import HTTP_CLIENT
from feather_lab.replay.vllm_fields import DEFAULT_METRICS, vllm_fields
from feather_lab.replay.workload import ReplayWorkload
from feather_lab.sim.result import SLO


@dataclass(frozen=True)
class ReplaySpec:
    labels: tuple[str, ...]
    """One name per server, in the order given (the first is A, the baseline)."""
    repeats: int = 1
    client: ClientOptions = field(default_factory=ClientOptions)
    slo: SLO = field(default_factory=SLO)
    metrics_interval_s: float = 1.0
    reset_prefix_cache: bool = True
    percentile_metrics: tuple[str, ...] = DEFAULT_METRICS
    """Metrics of the row's vLLM-named percentile fields (vllm_fields.py)."""
    metric_percentiles: tuple[float, ...] = (99.0,)


class Interrupted(Exception):
    """Ctrl-C during the runs; `runs` holds every run that finished and the one cut short."""

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        super().__init__("interrupted")
        self.runs = runs


RESETS = ("/reset_prefix_cache", "/flush_cache")
"""vLLM's prefix-cache reset, then SGLang's (tried when the first is not served)."""


async def _reset(client: httpx.AsyncClient, url: str) -> bool:
    for path in RESETS:
        try:
            resp = await client.post(url + path, timeout=30.0)
        except httpx.HTTPError:
            return False
        if resp.status_code != 404:
            return resp.status_code == 200
    return False


async def _run(
    endpoint: Endpoint, work: ReplayWorkload, spec: ReplaySpec, outcomes: list[Outcome]
) -> dict[str, Any]:
    """One run; returns the server-side fields (metrics, reset) for its row."""
    async with httpx.AsyncClient() as side:
        reset = await _reset(side, endpoint.url) if spec.reset_prefix_cache else False
        before = await scrape(side, endpoint.url)
    samples: list[dict[str, float]] = []

    async def during(client: httpx.AsyncClient) -> None:
        if before is not None:
            await sample_gauges(client, endpoint.url, spec.metrics_interval_s, samples)

    await run_schedule(endpoint, work.requests, spec.client, outcomes, during)
    async with httpx.AsyncClient() as side:
        after = await scrape(side, endpoint.url)
    return {"prefix_cache_reset": reset, **metric_fields(before, after, samples)}


def run_once(
    endpoint: Endpoint, label: str, work: ReplayWorkload, spec: ReplaySpec
) -> dict[str, Any]:
    """One workload against one server: its row. Ctrl-C raises Interrupted with the row of
    what finished (marked `interrupted`)."""
    outcomes: list[Outcome] = []
    cpu0 = time.process_time()
    try:
        server = asyncio.run(_run(endpoint, work, spec, outcomes))
    except KeyboardInterrupt:
        row = run_row(work.name, label, outcomes, spec.slo)
        raise Interrupted([{**row, "interrupted": True}]) from None
    row = run_row(work.name, label, outcomes, spec.slo)
    row = {**vllm_fields(outcomes, spec.percentile_metrics, spec.metric_percentiles), **row}
    row["client_cpu_s"] = round(time.process_time() - cpu0, 3)
    row["http_client"] = HTTP_CLIENT
    if "server_preemptions" in server:
        row["preemptions"] = server["server_preemptions"]
    return {**row, **server, "dropped_overlong": work.dropped, "url": endpoint.url}


def run_ab(
    endpoints: Sequence[Endpoint],
    workloads: Sequence[ReplayWorkload],
    spec: ReplaySpec,
    on_run: Callable[[dict[str, Any]], None] = lambda row: None,
) -> list[dict[str, Any]]:
    """Every (repeat, workload, server) run, servers alternating order by repeat; returns
    every run's row. Ctrl-C raises Interrupted holding the runs so far."""
    runs: list[dict[str, Any]] = []
    pairs = list(zip(spec.labels, endpoints))
    try:
        for rep in range(spec.repeats):
            for work in workloads:
                for label, endpoint in pairs if rep % 2 == 0 else pairs[::-1]:
                    try:
                        row = run_once(endpoint, label, work, spec)
                    except Interrupted as cut:
                        raise Interrupted(runs + cut.runs) from None
                    runs.append({**row, "repeat": rep})
                    on_run(row)
    except KeyboardInterrupt:  # between two runs
        raise Interrupted(runs) from None
    return runs


def summarize(
    runs: Sequence[dict[str, Any]], labels: Sequence[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runs as median rows per (workload, server), in workload then label order, and
    the A/B table (B/A per metric) over them."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        grouped.setdefault((r["workload"], r["policy"]), []).append(r)
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    rows = [
        median_row(grouped[(w, label)])
        for w in workloads
        for label in labels
        if (w, label) in grouped
    ]
    return rows, ab_rows(rows, labels)
