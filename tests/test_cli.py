"""The `feather` command's subcommands, run in-process on small inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from feather_lab.bench.index_bench import IndexBenchCase, make_queue, run_cases
from feather_lab.cli import app
from feather_lab.workloads.traces import write_jsonl
from feather_sched import Request

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
            "--xl-queues",
            "",
            "--chunk-size",
            "64",
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
        "cht_us_per_finish",
        "bytes_per_request",
        "digest_bytes_per_request",
    ):
        assert row[field] > 0
    assert row["digest_bytes_per_request"] == 8 * 32  # 2,000 tokens = 32 chunks of 64
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
    (row,) = run_cases(case, chunk_sizes=(8,), batch=4, running=4, repeats=1)
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


def test_trace_stats_refuses_what_it_cannot_use(tmp_path: Path) -> None:
    """An empty trace, a directory, and an output it cannot write: exit 2 with the reason,
    the last before the trace is read."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = runner.invoke(app, ["trace", "stats", str(empty)])
    assert result.exit_code == 2 and "no request" in result.output
    result = runner.invoke(app, ["trace", "stats", str(tmp_path)], terminal_width=200)
    assert result.exit_code == 2 and "is a directory" in result.output
    good = tmp_path / "t.jsonl"
    good.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n')
    args = ["trace", "stats", str(good), "--json", "/proc/feather-nope.json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "cannot write" in result.output


def test_trace_write_turns_a_workload_into_a_trace(tmp_path: Path) -> None:
    from feather_lab.workloads.traces import read_trace

    out = tmp_path / "t.jsonl"
    args = ["trace", "write", "shared-prefix", str(out), "--arrival", "poisson:20"]
    result = runner.invoke(app, [*args, "--limit", "40", "--seed", "3"])
    assert result.exit_code == 0, result.output
    requests = read_trace(out)
    assert len(requests) == 40 and len({r.arrival_time for r in requests}) == 40
    outputs = ["--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")]
    replay = ["bench", "-w", f"trace:{out}", "--rate-scale", "2", "--policies", "fcfs"]
    bench = runner.invoke(app, [*replay, *outputs])
    assert bench.exit_code == 0, bench.output
    for bad, text in [
        (["nope", str(tmp_path / "x.jsonl")], "unknown workload 'nope'; valid names: shared"),
        (["shared-prefix", "/proc/x.jsonl"], "OUT /proc/x.jsonl: cannot write"),
        (["shared-prefix", str(tmp_path / "y.jsonl"), "--arrival", "soon"], "'soon'"),
        ([f"trace:{out}", str(tmp_path / "z.jsonl"), "--arrival", "all"], "keeps its own"),
    ]:
        result = runner.invoke(app, ["trace", "write", *bad], terminal_width=300)
        assert result.exit_code == 2 and text in result.stderr, (bad, result.output)
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "y.jsonl").exists()


def test_train_uses_the_suites_engine_settings() -> None:
    from feather_lab.cli.train import _suite_max_num_seqs

    assert _suite_max_num_seqs("paper-5g") == 500  # what `feather bench` runs it with
    assert _suite_max_num_seqs("shared-prefix") == 256
    assert _suite_max_num_seqs("tree") == 256  # a generator outside the suite


def test_write_record_puts_the_machine_first_and_paths_as_text(tmp_path: Path) -> None:
    from feather_lab.bench.machine import write_json
    from feather_lab.bench.record import write_record

    out = tmp_path / "new" / "dir" / "r.json"  # its folder is made
    write_record(out, config={"state": tmp_path / "s.json"}, rows=[{"a": 1}])
    text = out.read_text()
    payload = json.loads(text)
    assert list(payload) == ["machine", "provenance", "config", "rows"] and text.endswith("}\n")
    assert {"command", "commit", "date"} <= set(payload["provenance"])
    assert payload["config"]["state"] == str(tmp_path / "s.json")
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        write_json(tmp_path / "bad.json", {"x": object()})  # only paths are converted


def _calibration_report() -> dict:
    e2e = {"workload": "w (kv)", "policy": "vllm", "real_tok_s": 1000.0, "sim_tok_s": 1100.0}
    e2e |= {"sim_over_real": 1.1, "real_mean_batch": 3.0, "sim_mean_batch": 3.5}
    return {
        "profile_path": "hw.json",
        "profile": {"name": "cpu-vllm-fitted", "step_overhead_s": 0.001, "peak_flops": 1e12},
        "train_mape": 0.05,
        "heldout_mape": 0.07,
        "heldout_mape_by_kind": {"decode": 0.06, "prefill": 0.1},
        "samples": {"train": 10, "heldout": 3},
        "end_to_end": [
            {**e2e, "replay_over_busy": None},
            {**e2e, "policy": "grouped", "replay_over_busy": 1.05},
        ],
        "spec": {"quick": True},
    }


def test_calibrate_prints_the_fit_and_records_the_report(tmp_path: Path, monkeypatch) -> None:
    from feather_lab.harness import vllm_calibrate
    from feather_lab.harness.vllm_calibrate_spec import COMPARE_POLICIES

    specs = []

    def fake_calibration(spec, out, on_progress=None, cache=None) -> dict:
        specs.append(spec)
        return _calibration_report()

    monkeypatch.setattr(vllm_calibrate, "run_calibration", fake_calibration)
    rows = tmp_path / "bench.json"
    rows.write_text(json.dumps({"rows": [{"workload": "w", "policy": "vllm"}]}))
    record = tmp_path / "cal.json"
    args = ["calibrate", "--quick", "--bench-json", str(rows), "--feather-hardware", "cpu"]
    result = runner.invoke(app, [*args, "--json", str(record)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "step-time MAPE: train 5.0% (10 samples), held-out 7.0% (3 samples: decode 6.0%" in (
        result.output
    )
    assert "fitted: step_overhead_s=0.001" in result.output and "peak_flops" not in result.output
    assert "model on real steps" in result.output and "1.05" in result.output
    payload = json.loads(record.read_text())
    assert list(payload) == ["machine", "provenance", *_calibration_report()]
    (spec,) = specs
    assert spec.bench.policies == COMPARE_POLICIES and spec.bench.repeats == 1
    assert spec.passes == 5 and spec.bench_rows == [{"workload": "w", "policy": "vllm"}]
    prior = {"hardware": "cpu", "model": "tiny-llama"}
    assert spec.bench.policy_options == {"feather": prior, "feather-hold": prior}
    bad = runner.invoke(app, ["calibrate", "--bench-json", str(record)])  # no "rows"
    assert bad.exit_code == 2 and "error: 'rows'" in bad.output


def test_bench_engine_vllm_records_its_spec(tmp_path: Path, monkeypatch) -> None:
    from dataclasses import asdict

    from feather_lab.harness import vllm_suite

    specs = []
    row = {"workload": "w (kv-64-blocks)", "policy": "vllm", "output_tok_s": 9.0, "vs_fcfs": 1.0}

    def fake_bench(spec, on_progress=None, cache=None) -> list[dict]:
        specs.append(spec)
        return [dict(row)]

    monkeypatch.setattr(vllm_suite, "run_vllm_bench", fake_bench)
    state, out = tmp_path / "state.json", tmp_path / "out" / "v.json"
    args = ["bench", "--engine", "vllm", "--num-kv-blocks", "64", "--async-scheduling"]
    args += ["--policy-state", str(state), "--json", str(out), "--plot", str(tmp_path / "v.png")]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "tiny-llama, seed 0, 3 runs, async scheduling" in result.output
    (spec,) = specs
    assert (
        list(spec.policies) == ["grouped", "feather", "feather-paper", "feather-upstream"]
        and spec.workloads is None
    )
    payload = json.loads(out.read_text())
    assert payload["rows"] == [row]
    config = payload["config"]
    assert config.pop("feather_version") and "git_commit" in config  # provenance first
    config.pop("git_commit")
    assert config == json.loads(json.dumps({"engine": "vllm", **asdict(spec)}, default=str))
    assert config["scenarios"] == [{"name": "kv-64-blocks", "num_blocks": 64}]
    assert config["policy_state"] == str(state) and config["max_num_seqs"] == 256


def test_train_reports_the_learning_curve(tmp_path: Path, monkeypatch) -> None:
    from feather_lab.rl import train as rl_train

    runs = []

    def fake_train(out, config, mix, cost=None) -> rl_train.TrainReport:
        runs.append((config, list(mix), cost))
        return rl_train.TrainReport(Path(out), 640, 12, 3.0, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])

    monkeypatch.setattr(rl_train, "require_rl", lambda: None)
    monkeypatch.setattr(rl_train, "train", fake_train)
    args = ["train", "-w", "paper-5g,mix", "--steps", "64", "--out", str(tmp_path / "w.npz")]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "trained 640 decisions over 12 episodes in 3 s" in result.output
    assert "first 1 1, last 1 6" in result.output
    ((config, mix, cost),) = runs
    assert config.steps == 64 and mix[0].max_num_seqs == 500  # the suite's, for paper-*
    # the CLI resolved (and so checked) the cost model once; train gets the object
    assert (cost.hardware.name, cost.model.name) == (config.hardware, config.model)
    assert mix[1:] == list(rl_train.DEFAULT_MIX)
    bad = runner.invoke(app, ["train", "-w", "no-such-workload"], terminal_width=200)
    assert bad.exit_code == 2 and "no-such-workload" in bad.output and not runs[1:]


def test_sglang_bench_without_sglang_is_a_clear_error() -> None:
    import importlib.util

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed here: the sglang suite runs the bench itself")
    result = CliRunner().invoke(app, ["sglang-bench", "--repeats", "1"])
    assert result.exit_code == 2
    assert "needs SGLang" in result.output
    # `bench --engine sglang` too: before any scheduler process, with the install line
    result = CliRunner().invoke(app, ["bench", "--engine", "sglang"], terminal_width=300)
    assert result.exit_code == 2 and result.exception is not None
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    assert "--engine sglang needs SGLang" in result.stderr
    assert "pip install --no-deps sglang==0.5.23" in result.stderr


def test_bench_says_what_the_scheduler_sees(tmp_path: Path) -> None:
    """`cap` by default, `exact` on request, in the header and the JSON; a bad value exits 2
    before any run."""
    small = ["bench", "-w", "document-qa", "--policies", "fcfs", "--limit", "16"]
    for given, sees in ((), "cap"), (("--scheduler-sees-output", "exact"), "exact"):
        out = tmp_path / f"{sees}.json"
        result = runner.invoke(app, [*small, *given, "--json", str(out)], terminal_width=300)
        assert result.exit_code == 0, result.output
        assert f"scheduler sees output: {sees}" in result.output
        assert json.loads(out.read_text())["config"]["scheduler_sees_output"] == sees
    bad = runner.invoke(app, [*small, "--scheduler-sees-output", "oracle", "--json",
                              str(tmp_path / "bad.json")], terminal_width=300)  # fmt: skip
    said = "--scheduler-sees-output 'oracle': valid: cap, exact"
    assert bad.exit_code == 2 and said in bad.stderr
    assert not (tmp_path / "bad.json").exists()
