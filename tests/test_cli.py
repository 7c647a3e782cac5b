"""The `feather` command's subcommands, run in-process on small inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from feather_sched import Request
from feather_sched.bench.index_bench import IndexBenchCase, make_queue, run_case
from feather_sched.cli import app
from feather_sched.workloads.traces import write_jsonl

runner = CliRunner()


def test_index_bench_writes_rows(tmp_path: Path) -> None:
    out = tmp_path / "ib.json"
    result = runner.invoke(
        app,
        [
            "index-bench",
            "--queues",
            "300",
            "--long-queues",
            "",
            "--repeats",
            "1",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    (row,) = payload["rows"]
    assert row["queue"] == 300 and row["prompt_tokens"] == 2000
    for field in (
        "cht_us_per_decision",
        "radix_us_per_decision",
        "cht_us_per_insert",
        "radix_us_per_insert",
    ):
        assert row[field] > 0
    assert payload["machine"]["cores"] >= 1


def test_index_bench_rejects_bad_queue_list() -> None:
    result = runner.invoke(app, ["index-bench", "--queues", "10,abc"])
    assert result.exit_code != 0
    assert "comma-separated integers" in result.output


def test_bench_queue_shares_prefixes_by_group() -> None:
    case = IndexBenchCase(queue=50, prompt_tokens=40, prefix_tokens=30, num_prefixes=5)
    prompts = make_queue(case, seed=3)
    assert len(prompts) == 50 and all(p.size == 40 for p in prompts)
    assert len({p[:30].tobytes() for p in prompts}) <= 5
    assert all(np.array_equal(a, b) for a, b in zip(prompts, make_queue(case, seed=3)))
    row = run_case(case, chunk_size=8, batch=4, running=4, repeats=1)
    assert row.decision_batch == 4


def test_trace_stats_on_own_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    shared = np.arange(10)
    write_jsonl(
        path,
        [
            Request("a", np.r_[shared, [100, 101]], 3, 0.0),
            Request("b", np.r_[shared, [200]], 2, 1.0),
            Request("c", np.array([7, 8, 9]), 1, 2.0),
        ],
    )
    result = runner.invoke(app, ["trace", "stats", str(path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "3" in result.output
    # a and b share 10 tokens each; c shares nothing: 20 of 26 prompt tokens
    assert "76.9%" in result.output


def test_trace_stats_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 5, "input_length": 10, "output_length": 1}\n'
    )
    result = runner.invoke(app, ["trace", "stats", str(path)], terminal_width=200)
    assert result.exit_code == 2
    assert "bad.jsonl" in result.output and "line 2" in result.output
    assert "hash_ids" in result.output


def test_trace_stats_missing_file() -> None:
    result = runner.invoke(app, ["trace", "stats", "/nonexistent/trace.jsonl"])
    assert result.exit_code != 0
    assert "no such file" in result.output


def test_train_uses_the_suites_engine_settings() -> None:
    from feather_sched.cli import _suite_max_num_seqs

    assert _suite_max_num_seqs("paper-5g") == 500  # what `feather bench` runs it with
    assert _suite_max_num_seqs("shared-prefix") == 256
    assert _suite_max_num_seqs("tree") == 256  # a generator outside the suite
