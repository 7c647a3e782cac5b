"""Feather's `/metrics` series (host/metrics.py): what a scheduler process writes is what the
API server's collector exports, through a real prometheus_client registry; nothing is
exported (and nothing fails) without a snapshot or without a writable directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from feather_sched.host.admission import HostStats
from feather_sched.host.metrics import MetricsPublisher, SnapshotCollector, read_snapshots


def test_publisher_snapshot_is_read_back(tmp_path: Path) -> None:
    pub = MetricsPublisher(tmp_path, "feather")
    assert pub.due(idle=False)  # nothing written yet: due at once
    for groups in (1, 1, 3, 300):
        pub.observe_groups(groups)
    stats = HostStats(decisions=10, stops=3, queue_order_steps=4, policy_errors=1, forced=2)
    pub.publish(stats, holds=5)
    assert not pub.due(idle=True)  # written, nothing new since
    pub.observe_groups(2)
    assert pub.due(idle=True) and not pub.due(idle=False)
    (snap,) = read_snapshots(tmp_path)
    assert snap["policy"] == "feather"
    assert snap["counters"]["decisions"] == {"add": 7, "stop": 3}
    assert snap["counters"]["kv_gate_holds"] == {"": 5}
    assert snap["counters"]["engine_order_steps"]["policy_error"] == 1
    assert sum(snap["groups"]["buckets"]) == 4 and snap["groups"]["sum"] == 305
    assert snap["groups"]["buckets"][-1] == 1  # 300 is past the last bound: +Inf


def test_no_directory_or_unwritable_one_is_no_metrics(tmp_path: Path) -> None:
    off = MetricsPublisher(None, "feather")
    off.observe_groups(1)
    assert not off.due(idle=True)
    off.publish(HostStats(), 0)  # nothing, no error
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad = MetricsPublisher(blocked / "sub", "feather")
    bad.publish(HostStats(), 0)  # logged once, never raised
    assert bad._failed and read_snapshots(tmp_path) == []


def test_collector_exports_the_series_summed_over_engines(tmp_path: Path) -> None:
    prom = pytest.importorskip("prometheus_client", reason="vLLM's prometheus_client")
    for pid_groups in ((1, 2), (4,)):
        pub = MetricsPublisher(tmp_path, "feather")
        pub.path = tmp_path / f"engine-{len(pid_groups)}.json"  # two engine processes
        for g in pid_groups:
            pub.observe_groups(g)
        pub.publish(HostStats(decisions=5, stops=1), holds=2)
    registry = prom.CollectorRegistry()
    registry.register(SnapshotCollector(tmp_path))
    text = prom.generate_latest(registry).decode()
    assert 'feather_decisions_total{decision="add"} 8.0' in text
    assert "feather_kv_gate_holds_total 4.0" in text
    assert 'feather_info{policy="feather"} 1.0' in text
    assert "feather_batch_prefix_groups_count 3.0" in text
    assert "feather_batch_prefix_groups_sum 7.0" in text
    assert 'feather_batch_prefix_groups_bucket{le="2.0"} 2.0' in text
    empty = prom.CollectorRegistry()
    empty.register(SnapshotCollector(tmp_path / "none"))
    assert "feather_" not in prom.generate_latest(empty).decode()
