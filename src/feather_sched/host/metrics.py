"""Feather's decisions as Prometheus series (`feather_*`) on the engine's own `/metrics`.

An engine's scheduler runs in a process of its own (vLLM's engine core, SGLang's scheduler)
while `/metrics` is served by the API server's process, from its own registry. vLLM carries
nothing of a custom scheduler's to that process (its `SchedulerStats` has fixed fields and
prometheus_client's multiprocess mode is on only with several API servers), so the two sides
meet in a directory:

- engine side (`MetricsPublisher`): the host's counters (`HostStats`), the policy's KV-gate
  refusals and a histogram of prefix groups per scheduled batch, written as one small JSON
  file per scheduler process, at most once a second while serving and when the engine goes
  idle or shuts down (a step pays one histogram bucket increment and one clock read);
- API-server side (`SnapshotCollector`): a prometheus_client collector that reads the
  directory at each scrape and sums the files (data-parallel engines each write one).

`FEATHER_METRICS_DIR` names the directory; the vLLM plugin (vllm/plugin.py) sets it in the
API server before the engine core starts, which inherits it. prometheus_client is optional:
without it (or without the directory) nothing is exported and nothing fails.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from feather_sched.host.admission import HostStats

__all__ = [
    "GROUP_BUCKETS",
    "METRICS_DIR_ENV",
    "MetricsPublisher",
    "SnapshotCollector",
    "read_snapshots",
    "snapshot_root",
]

logger = logging.getLogger("feather_sched")

METRICS_DIR_ENV = "FEATHER_METRICS_DIR"
"""The directory the engine's scheduler writes its snapshot to and `/metrics` reads."""

GROUP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)
"""Upper bounds of the prefix-groups-per-batch histogram (+Inf is added)."""

PUBLISH_EVERY_S = 1.0

INFO = ("feather_info", "Feather's policy in this engine")
"""The info gauge's name and help: 1, labelled with the policy."""
GROUPS = (
    "feather_batch_prefix_groups",
    "Distinct prefix groups (first CHT chunks) among the running requests of each scheduled batch",
)
"""The prefix-groups-per-batch histogram's name and help."""

COUNTERS: dict[str, tuple[str, str | None]] = {
    # series name (without feather_ and _total) -> (help, label of `kind` or None)
    "decisions": ("ADD/STOP decisions the policy made, by decision", "decision"),
    "kv_gate_holds": ("Candidates the KV gate held back (the queue waited for KV)", None),
    "engine_order_steps": (
        "Steps left to the engine's own order, by reason (queue_order: the policy follows "
        "it; policy_error: the policy failed; handover: the engine walked past its pick)",
        "reason",
    ),
    "policy_steps": ("Steps whose admission the policy drove", None),
    "admitted": ("Requests admitted through the policy's pick", None),
    "forced_admits": ("Queue heads admitted because nothing was running (never stall)", None),
    "resyncs": ("Times Feather's index was rebuilt from the engine's queues (expect 0)", None),
}


def publish_due(last: float, dirty: bool, idle: bool) -> bool:
    """A second has passed since `last`, or the engine just went idle with batches not yet
    published: the one throttle of both exporters."""
    return (idle and dirty) or time.monotonic() - last >= PUBLISH_EVERY_S


def counter_values(stats: HostStats, kv_gate_holds: int) -> dict[str, dict[str, int]]:
    """The counters' values by series and label value ("" where unlabelled)."""
    return {
        "decisions": {"add": stats.decisions - stats.stops, "stop": stats.stops},
        "kv_gate_holds": {"": kv_gate_holds},
        "engine_order_steps": {
            "queue_order": stats.queue_order_steps,
            "policy_error": stats.policy_errors,
            "handover": stats.handovers,
        },
        "policy_steps": {"": stats.policy_steps},
        "admitted": {"": stats.admitted},
        "forced_admits": {"": stats.forced},
        "resyncs": {"": stats.resyncs},
    }


class MetricsPublisher:
    """Engine side: the groups histogram and the snapshot file of one scheduler process."""

    def __init__(self, directory: str | os.PathLike[str] | None, policy: str) -> None:
        self.path = None if directory is None else Path(directory) / f"engine-{os.getpid()}.json"
        self.policy = policy
        self.buckets = [0] * (len(GROUP_BUCKETS) + 1)
        self.groups_sum = 0
        self._last = 0.0
        self._dirty = False
        self._failed = False
        self._made = False

    @classmethod
    def from_env(cls, policy: str) -> MetricsPublisher:
        return cls(os.environ.get(METRICS_DIR_ENV) or None, policy)

    def observe_groups(self, groups: int) -> None:
        """One scheduled batch with `groups` distinct prefix groups running."""
        self.buckets[bisect.bisect_left(GROUP_BUCKETS, groups)] += 1
        self.groups_sum += groups
        self._dirty = True

    def due(self, idle: bool) -> bool:
        """Whether to write the snapshot now: a second has passed, or the engine just went
        idle with batches not yet written."""
        return self.path is not None and publish_due(self._last, self._dirty, idle)

    def publish(self, stats: HostStats, holds: int) -> None:
        """Write the snapshot now (atomically: a scrape never reads half a file)."""
        if self.path is None or self._failed:
            return
        self._last, self._dirty = time.monotonic(), False
        snapshot = {
            "policy": self.policy,
            "counters": counter_values(stats, holds),
            "groups": {"buckets": self.buckets, "sum": self.groups_sum},
        }
        tmp = self.path.with_suffix(".tmp")
        try:
            if not self._made:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._made = True
            tmp.write_text(json.dumps(snapshot))
            os.replace(tmp, self.path)
        except OSError as err:  # metrics must never take the engine down: say so once
            self._failed = True
            logger.warning("feather metrics off: cannot write %s (%s)", self.path, err)


def snapshot_root() -> str | None:
    """Where to make the snapshot directory: /dev/shm where there is one (memory: a
    snapshot written there costs ~50 us, on a VM's disk it took 1-5 ms), else the
    system's temporary directory (None)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def read_snapshots(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every engine's latest snapshot in `directory` (unreadable files are skipped)."""
    found = []
    for path in sorted(Path(directory).glob("engine-*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


class SnapshotCollector:
    """API-server side: a prometheus_client collector over the snapshot directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = directory

    def describe(self) -> list:
        return []  # families are only known once an engine wrote: no check at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        snaps = read_snapshots(self.directory)
        if not snaps:
            return
        info = GaugeMetricFamily(*INFO, labels=["policy"])
        for policy in sorted({s["policy"] for s in snaps}):
            info.add_metric([policy], 1.0)
        yield info
        for name, (text, label) in COUNTERS.items():
            family = CounterMetricFamily(f"feather_{name}", text, labels=[label] if label else [])
            totals: dict[str, int] = {}
            for snap in snaps:
                for key, value in snap["counters"].get(name, {}).items():
                    totals[key] = totals.get(key, 0) + int(value)
            for key, value in totals.items():
                family.add_metric([key] if label else [], value)
            yield family
        yield _groups_family(HistogramMetricFamily, snaps)


def _groups_family(family_cls: Any, snaps: list[dict[str, Any]]) -> Any:
    counts = [0] * (len(GROUP_BUCKETS) + 1)
    total = 0
    for snap in snaps:
        for i, n in enumerate(snap["groups"]["buckets"]):
            counts[i] += n
        total += snap["groups"]["sum"]
    cumulative, running = [], 0
    for bound, n in zip([*(str(float(b)) for b in GROUP_BUCKETS), "+Inf"], counts):
        running += n
        cumulative.append((bound, running))
    return family_cls(*GROUPS, buckets=cumulative, sum_value=total)
