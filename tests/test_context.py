"""Context limits: overlong requests are an error before the run, or dropped and counted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from feather_lab.bench.context import OverlongError, fit_context
from feather_lab.cli import app
from feather_lab.workloads.traces import write_jsonl
from feather_sched import Request
from feather_sched.cost import load_model


def _req(rid: str, prompt: int, output: int = 10, parent: str | None = None) -> Request:
    r = Request(rid, np.arange(prompt) % 500, output, 0.0)
    if parent:
        r.meta["depends_on"] = parent
    return r


def test_overlong_requests_are_named_with_the_limit() -> None:
    reqs = [_req("ok", 90), _req("long", 95), _req("longer", 200)]
    with pytest.raises(OverlongError, match=r"2 of 3 requests .* 100 tokens.*longer \(210\)"):
        fit_context(reqs, 100, drop=False, source="w")
    assert fit_context(reqs[:1], 100, drop=False, source="w") == (reqs[:1], 0)
    assert fit_context(reqs, 0, drop=False, source="w")[1] == 0  # unknown limit: unchecked


def test_dropping_takes_the_later_turns_of_a_dropped_conversation() -> None:
    reqs = [
        _req("t0", 50),
        _req("t1", 500, parent="t0"),  # overlong
        _req("t2", 60, parent="t1"),  # depends on a dropped turn
        _req("t3", 70, parent="t2"),
        _req("other", 40),
    ]
    kept, dropped = fit_context(reqs, 100, drop=True, source="w")
    assert [r.request_id for r in kept] == ["t0", "other"] and dropped == 3


def test_long_context_profile() -> None:
    assert load_model("llama-3.1-8b").max_context_tokens == 131_072
    assert load_model("llama-3-8b").max_context_tokens == 8192


def test_bench_refuses_then_drops_an_overlong_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    shared = np.arange(64)
    write_jsonl(
        trace,
        [
            Request("a", np.r_[shared, [1, 2]], 4, 0.0),
            Request("b", np.r_[shared, np.arange(9000) % 300], 4, 0.1),
            Request("c", np.r_[shared, [3]], 4, 0.2),
        ],
    )
    args = ["bench", "-w", f"trace:{trace}", "--model", "llama-3-8b", "--policies", "fcfs"]
    out = ["--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")]
    refused = CliRunner().invoke(app, args + out, terminal_width=200)
    assert refused.exit_code == 2
    assert "1 of 3 requests" in refused.output and "8,192" in refused.output
    assert not (tmp_path / "b.json").exists()  # refused before any run
    ran = CliRunner().invoke(app, [*args, *out, "--drop-overlong"], terminal_width=200)
    assert ran.exit_code == 0, ran.output
    (row,) = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert row["dropped_overlong"] == 1 and row["requests"] == 2
