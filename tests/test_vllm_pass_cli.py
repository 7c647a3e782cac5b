"""`feather vllm-bench` refuses bad input before any work (exit 2, the value named), with or
without vLLM installed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from feather_sched.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope"], "--policy 'nope' is not a policy"),
        (["--sizes", "10,abc"], "comma-separated integers"),
        (["--kv-blocks", "2"], "--kv-blocks 2 x 32 tokens cannot hold one request"),
        (["--steps", "0"], "--steps"),
    ],
)
def test_bad_input_exits_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["vllm-bench", *args])
    assert result.exit_code == 2
    assert message in result.output
