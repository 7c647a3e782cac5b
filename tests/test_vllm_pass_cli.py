"""`feather vllm-bench` without vLLM: bad input refused before any work (exit 2, the value
named), and the per-run accounting that refuses a run which lost a request."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from feather_lab.cli import app

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


class _Tracker:
    """What the accounting reads off Feather's tracker."""

    def __init__(self, n: int) -> None:
        self.num_tracked = n

    def __len__(self) -> int:
        return self.num_tracked


def _books(tracked: int | None = None, leftover: dict | None = None, **over) -> dict:
    """`account` on a scheduler that holds `leftover` requests (and, with `tracked`, a
    Feather tracker holding that many) after a run of 3 requests: 1 finished, 2 aborted."""
    from feather_lab.harness.vllm_bench_run import account
    from feather_lab.harness.vllm_bench_spec import VllmPassSpec

    feather = None if tracked is None else SimpleNamespace(index=_Tracker(tracked))
    sched = SimpleNamespace(requests=leftover or {}, waiting=[], running=[], feather=feather)
    args = {"added": ["a", "b", "c"], "finished": {"a": 8}, "waiting": 1, "running": 1} | over
    return account(sched, VllmPassSpec(), **args)


def test_run_accounting_catches_a_lost_request() -> None:
    """What `vllm-bench` checks after each run: every request finished whole, or aborted from
    the queue or the batch, and nothing left behind in vLLM or in Feather's tracker."""
    assert _books() == {"added": 3, "finished": 1, "aborted_waiting": 1, "aborted_running": 1}
    assert _books(tracked=0)["added"] == 3
    bad = [
        ({"waiting": 0}, "2 unfinished but 0 waiting"),
        ({"finished": {"a": 7}}, "finished without their 8 tokens"),
        ({"added": ["a", "a", "b"]}, "issued twice"),
        ({"leftover": {"b": 1}}, "still holds requests"),
        ({"tracked": 2}, "tracker still holds 2"),
    ]
    for over, message in bad:
        with pytest.raises(RuntimeError, match=message):
            _books(**over)
