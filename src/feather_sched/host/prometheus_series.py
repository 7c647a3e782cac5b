"""Feather's `feather_*` series as prometheus_client metrics of the scheduler process itself.

SGLang serves `/metrics` in prometheus_client's multiprocess mode: with `--enable-metrics`
its launcher sets `PROMETHEUS_MULTIPROC_DIR` before any process starts
(`sglang.srt.utils.common.set_prometheus_multiproc_dir`), each scheduler creates plain
`Counter`/`Gauge`/`Histogram` objects (`SchedulerMetricsCollector`) whose values live in
per-process files there, and the HTTP server's registry reads them all through
`multiprocess.MultiProcessCollector` (`add_prometheus_middleware`). So Feather does the same in
the scheduler process: its series reach `/metrics` with SGLang's own, summed over processes.

Names, help texts and labels are those the vLLM side exports (host/metrics.py), so two servers
compare series by series. Per scheduled batch this pays one `Histogram.observe` (the prefix
groups) and one clock read; the counters follow `HostStats` as deltas, at most once a second
and when the engine goes idle (benchmarks/sglang/metrics_cost.py measures both).
"""

from __future__ import annotations

import time
from typing import Any

from feather_sched.host.admission import HostStats
from feather_sched.host.metrics import (
    COUNTERS,
    GROUP_BUCKETS,
    GROUPS,
    INFO,
    counter_values,
    publish_due,
)

__all__ = ["PrometheusSeries"]


class PrometheusSeries:
    """One scheduler process's `feather_*` series, written through prometheus_client.

    Metrics are created unregistered (`registry=None`): in multiprocess mode a scrape reads
    them from their files, and a process may build several schedulers (tests) without
    prometheus_client's duplicate-name check refusing the second."""

    def __init__(self, policy: str) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.counters = {
            name: Counter(f"feather_{name}", text, [label] if label else [], registry=None)
            for name, (text, label) in COUNTERS.items()
        }
        self.groups = Histogram(*GROUPS, buckets=GROUP_BUCKETS, registry=None)
        info = Gauge(*INFO, ["policy"], registry=None, multiprocess_mode="max")
        info.labels(policy).set(1.0)
        for name, values in counter_values(HostStats(), 0).items():
            for key in values:  # every series shows from the start, at 0 (as vLLM's do)
                if key:
                    self.counters[name].labels(key)
        self._sent: dict[tuple[str, str], int] = {}
        self._last = 0.0
        self._dirty = False

    def observe_groups(self, groups: int) -> None:
        """One scheduled batch with `groups` distinct prefix groups running."""
        self.groups.observe(groups)
        self._dirty = True

    def due(self, idle: bool) -> bool:
        """Whether to bring the counters up to date: a second has passed, or the engine just
        went idle with batches since the last update."""
        return publish_due(self._last, self._dirty, idle)

    def publish(self, stats: HostStats, holds: int) -> None:
        """Add to each counter what `stats` (and the KV gate's `holds`) gained since the last
        call; a counter that went down (a swapped policy's) is left where it is."""
        self._last, self._dirty = time.monotonic(), False
        for name, values in counter_values(stats, holds).items():
            counter = self.counters[name]
            for key, value in values.items():
                gained = value - self._sent.get((name, key), 0)
                if gained > 0:
                    child: Any = counter.labels(key) if key else counter
                    child.inc(gained)
                    self._sent[(name, key)] = value
