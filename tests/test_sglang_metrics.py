"""Feather's `feather_*` series on SGLang's `/metrics` (sglang 0.5.x on CPU, extra 'sglang').

A real `sglang.srt.managers.scheduler.Scheduler` process with `enable_metrics` on serves a
workload (harness/sglang_engine.py), writing prometheus_client's multiprocess files where
`PROMETHEUS_MULTIPROC_DIR` says, as SGLang's launcher sets it. The test then reads that
directory the way SGLang's HTTP server does (`MultiProcessCollector`, from another process)
and checks Feather's series are there beside SGLang's own and count what the scheduler's
report says Feather did.
"""

from __future__ import annotations

import random

import pytest

from test_sglang_scheduler import _require_sglang as require_sglang

pytestmark = pytest.mark.sglang


def _require_sglang() -> None:
    require_sglang()
    pytest.importorskip("prometheus_client", reason="SGLang's metrics need prometheus_client")


def workload(tag: str, n: int = 24, seed: int = 0):
    """Four prefix groups arriving interleaved in two waves."""
    from feather_lab.harness.sglang_spec import ServeRequest

    rng = random.Random(seed)
    prefixes = {g: [rng.randrange(4, 500) for _ in range(96)] for g in "ABCD"}
    return [
        ServeRequest(
            rid=f"{tag}{'ABCD'[i % 4]}{i:03d}",
            prompt=prefixes["ABCD"[i % 4]] + [rng.randrange(4, 500) for _ in range(16)],
            output_len=8 + (i * 5) % 29,
            arrival_s=0.0 if i < n // 2 else 0.3,
        )
        for i in range(n)
    ]


def scrape(directory) -> dict[str, float]:
    """`/metrics` as SGLang's HTTP server builds it, as {"name{labels}": value}."""
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    found = {}
    for family in registry.collect():
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}"] = sample.value
    return found


@pytest.fixture(scope="module")
def served_with_metrics(tmp_path_factory):
    _require_sglang()
    from feather_lab.harness.sglang_engine import serve
    from feather_lab.harness.sglang_spec import ServeSpec

    directory = tmp_path_factory.mktemp("prometheus-multiproc")
    spec = ServeSpec(
        runs=[workload("m", seed=3)],
        feather_policy="grouped",
        max_total_tokens=1400,
        max_running_requests=12,
        chunked_prefill_size=256,
        chunk_tokens=32,
        enable_metrics=True,
        env={"PROMETHEUS_MULTIPROC_DIR": str(directory)},
    )
    return serve(spec), scrape(directory)


def test_feather_series_are_on_sglangs_metrics_and_count(served_with_metrics):
    report, series = served_with_metrics
    stats = report["feather"]["stats"]
    assert any(name.startswith("sglang:") for name in series), "SGLang's own metrics are on"
    assert series["feather_info{policy=grouped}"] == 1.0
    adds = series["feather_decisions_total{decision=add}"]
    stops = series["feather_decisions_total{decision=stop}"]
    assert adds + stops == stats["decisions"] > 0
    assert stops == stats["stops"]
    assert series["feather_policy_steps_total{}"] == stats["policy_steps"] > 0
    assert series["feather_admitted_total{}"] == stats["admitted"] > 0
    assert series["feather_engine_order_steps_total{reason=handover}"] == stats["handovers"]
    batches = series["feather_batch_prefix_groups_count{}"]
    assert batches == report["loop"]["steps"] > 0, "one observation per scheduled batch"
    assert series["feather_batch_prefix_groups_sum{}"] >= batches  # a batch runs >= 1 group
    assert series["feather_batch_prefix_groups_bucket{le=+Inf}"] == batches


def test_no_series_where_sglangs_metrics_are_off(tmp_path):
    """Without `--enable-metrics` the scheduler writes nothing, even with the directory set."""
    _require_sglang()
    from feather_lab.harness.sglang_engine import serve
    from feather_lab.harness.sglang_spec import ServeSpec

    spec = ServeSpec(
        runs=[workload("n", n=8, seed=4)],
        feather_policy="grouped",
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
    )
    report = serve(spec)
    assert report["feather"]["policy"] == "grouped" and report["loop"]["steps"] > 0
    assert not [name for name in scrape(tmp_path) if name.startswith("feather_")]
