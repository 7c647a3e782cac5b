"""`feather bench` end to end on a small trace, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from feather_lab.cli import app
from feather_lab.workloads.traces import write_jsonl
from feather_sched import Request

runner = CliRunner()


def _trace(path: Path) -> Path:
    rng = np.random.default_rng(0)
    prefixes = [rng.integers(0, 1000, 512) for _ in range(3)]
    reqs = [
        Request(f"t{i}", np.r_[prefixes[i % 3], rng.integers(0, 1000, 8)], 6, 0.0)
        for i in range(30)
    ]
    write_jsonl(path, reqs)
    return path


def test_bench_writes_json_and_plot(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    result = runner.invoke(
        app,
        [
            "bench",
            "-w",
            f"trace:{trace}",
            "--policies",
            "fcfs,grouped,feather,oracle",
            "--max-num-seqs",
            "8",
            "--json",
            str(out),
            "--plot",
            str(png),
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    assert [r["policy"] for r in rows] == ["fcfs", "grouped", "feather", "oracle"]
    for r in rows:
        assert r["workload"] == f"trace:{trace}"
        assert r["requests"] == 30 and r["output_tokens"] == 180
        assert r["output_tok_s"] > 0 and r["mean_batch"] > 0
    assert rows[0]["vs_fcfs"] == 1.0
    assert rows[-1]["oracle_cap"] in (2, 4, 8)
    assert png.stat().st_size > 1000
    # the main job stands on the measured profile, and its record says so
    assert payload["config"]["hardware"] == "h200"
    assert payload["config"]["hardware_provenance"] == "measured"
    assert "benchmarks/gpu/PROFILE.json" in payload["config"]["hardware_provenance_note"]


def test_bench_rejects_unknown_policy_and_workload(tmp_path: Path) -> None:
    result = runner.invoke(app, ["bench", "--policies", "fcfs,nope"])
    assert result.exit_code == 2
    assert "unknown policies ['nope']" in result.output
    result = runner.invoke(
        app,
        [
            "bench",
            "-w",
            "no-such-workload",
            "--policies",
            "fcfs",
            "--json",
            str(tmp_path / "x.json"),
            "--plot",
            str(tmp_path / "x.png"),
        ],
    )
    assert result.exit_code == 2
    assert "no-such-workload" in result.output
    result = runner.invoke(app, ["bench", "--hardware", "tpu9", "--policies", "fcfs"])
    assert result.exit_code == 2
    assert "tpu9" in result.output


def test_bench_policy_state_is_saved_then_loaded(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    prefixes = [rng.integers(0, 1000, 2048) for _ in range(3)]
    reqs = [
        Request(f"s{i}", np.r_[prefixes[i % 3], rng.integers(0, 1000, 8)], 20, 0.0)
        for i in range(60)
    ]
    trace = tmp_path / "s.jsonl"
    write_jsonl(trace, reqs)
    state = tmp_path / "feather-state.json"
    args = [
        "bench",
        "-w",
        f"trace:{trace}",
        "--policies",
        "feather",
        "--max-num-seqs",
        "32",
        "--policy-state",
        str(state),
        "--json",
        str(tmp_path / "o.json"),
        "--plot",
        str(tmp_path / "o.png"),
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    saved = json.loads(state.read_text())
    assert saved["policy"] == "feather" and saved["table"]
    second = runner.invoke(app, args)  # starts warm from the saved table, then saves again
    assert second.exit_code == 0, second.output
    again = json.loads(state.read_text())
    pulls = lambda table: sum(add[0] + stop[0] for add, stop in table.values())  # noqa: E731
    assert pulls(again["table"]) >= pulls(saved["table"])


def test_bench_record_echoes_the_options_as_given(tmp_path: Path) -> None:
    """`max_num_seqs` is null in the record when each workload kept its own."""
    trace = _trace(tmp_path / "t.jsonl")
    out = tmp_path / "o.json"
    args = ["bench", "-w", f"trace:{trace}", "--policies", "fcfs", "--seed", "2", "--json"]
    result = runner.invoke(app, [*args, str(out), "--plot", str(tmp_path / "o.png")])
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    assert list(payload) == ["machine", "provenance", "config", "rows"]
    config = payload["config"]
    assert config["feather_version"] and "git_commit" in config
    expected = {
        "hardware": "h200",
        "hardware_provenance": "measured",
        "model": "llama-3.1-8b",
        "kernel": "paged",
        "seed": 2,
        "drop_overlong": False,
        "engine": {"max_num_seqs": None, "max_num_batched_tokens": 8192, "num_kv_blocks": None},
    }
    assert {k: config[k] for k in expected} == expected
    # what each workload ran with: every generator parameter and its engine cap
    params = config["workloads"][f"trace:{trace}"]
    assert params["generator"] == "TraceWorkload" and params["path"] == str(trace)
    assert params["max_num_seqs"] == 256 and params["requests"] == 30
