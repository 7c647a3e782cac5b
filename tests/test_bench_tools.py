"""What a user runs around `feather bench`: rates, limits, latency and goodput, the step log,
the result tools (`--version`, `list`, `show`, `compare`) and the public Python API."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import typer.main
from typer.testing import CliRunner

from feather_lab.cli import app
from feather_lab.workloads.traces import write_jsonl
from feather_sched import Request

runner = CliRunner()
LATENCY_FIELDS = ("ttft_p99_s", "tpot_p99_s", "latency_p99_s", "goodput_req_s")


def _trace(path: Path, n: int = 40) -> Path:
    rng = np.random.default_rng(0)
    prefixes = [rng.integers(0, 1000, 256) for _ in range(4)]
    reqs = [
        Request(f"t{i:03d}", np.r_[prefixes[i % 4], rng.integers(0, 1000, 8)], 8, i * 0.5)
        for i in range(n)
    ]
    write_jsonl(path, reqs)
    return path


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("bench")
    trace = _trace(tmp / "t.jsonl")
    out, steps = tmp / "r.json", tmp / "s.jsonl"
    args = ["bench", "-w", f"trace:{trace}", "--rate-scale", "10", "--limit", "30"]
    args += ["--policies", "fcfs,feather,hrrn", "--slo-ttft", "5", "--slo-tpot", "0.2"]
    args += ["--steps-out", str(steps), "--json", str(out), "--plot", str(tmp / "r.png")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, steps, trace


def test_trace_at_ten_times_its_rate_first_30(record) -> None:
    out, steps, trace = record
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    assert [r["policy"] for r in rows] == ["fcfs", "feather", "hrrn"]
    for r in rows:
        assert r["requests"] == 30
        assert all(r[f] is not None for f in LATENCY_FIELDS)
        assert r["ttft_p50_s"] <= r["ttft_p90_s"] <= r["ttft_p99_s"]
        assert 0 <= r["slo_met"] <= 30
    params = payload["config"]["workloads"][f"trace:{trace}"]
    assert params["limit"] == 30 and params["rate_scale"] == 10
    assert payload["config"]["slo"] == {"ttft_s": 5, "tpot_s": 0.2}
    # 30 requests 0.05 s apart: the last arrives at 1.45 s, not 14.5 s
    lines = [json.loads(x) for x in steps.read_text().splitlines()]
    assert lines and {x["policy"] for x in lines} == {"fcfs", "feather", "hrrn"}
    admitted = [rid for x in lines if x["policy"] == "fcfs" for rid in x["admitted"]]
    assert sorted(admitted) == [f"t{i:03d}" for i in range(30)]
    decisions = [d for x in lines for d in x["decisions"]]
    assert decisions and {"batch", "depth", "group", "action"} <= set(decisions[0])
    assert {d["action"] for d in decisions} <= {"ADD", "STOP"}


def test_show_and_compare_read_the_record(record) -> None:
    out, _, _ = record
    shown = runner.invoke(app, ["show", str(out), "--csv"])
    assert shown.exit_code == 0, shown.output
    table = list(csv.DictReader(io.StringIO(shown.stdout)))
    assert [r["policy"] for r in table] == ["fcfs", "feather", "hrrn"]
    assert "goodput_req_s" in table[0]
    md = runner.invoke(app, ["show", str(out), "--markdown"])
    assert md.exit_code == 0 and md.stdout.startswith("| workload | policy |")
    plain = runner.invoke(app, ["show", str(out)])
    rows = [x for x in plain.stdout.splitlines() if x.startswith(" ")]
    assert plain.exit_code == 0 and rows and all(len(x) <= 80 for x in rows)
    cmp = runner.invoke(app, ["compare", str(out), str(out)])
    assert cmp.exit_code == 0, cmp.output
    assert "1.000x" in cmp.stdout and "hrrn" in cmp.stdout


def test_compare_refuses_records_with_nothing_in_common_and_warns_on_setups(
    record, tmp_path: Path
) -> None:
    out, _, _ = record
    payload = json.loads(out.read_text())
    other = {**payload, "rows": [{**r, "workload": "elsewhere"} for r in payload["rows"]]}
    (tmp_path / "other.json").write_text(json.dumps(other))
    result = runner.invoke(app, ["compare", str(out), str(tmp_path / "other.json")])
    assert result.exit_code == 2 and result.stdout == ""
    assert "no (workload, policy) pair in common" in result.stderr
    assert "workloads elsewhere; policies fcfs, feather, hrrn" in result.stderr
    config = {**payload["config"], "hardware": "a100", "model": "qwen2.5-7b"}
    (tmp_path / "a100.json").write_text(json.dumps({**payload, "config": config}))
    result = runner.invoke(app, ["compare", str(out), str(tmp_path / "a100.json")])
    assert result.exit_code == 0 and "1.000x" in result.stdout
    warning = "warning: A and B differ in hardware (h200 vs a100), model (llama-3.1-8b vs "
    assert result.stderr.startswith(warning) and len(result.stderr.splitlines()) == 1
    same = runner.invoke(app, ["compare", str(out), str(out)])
    assert same.exit_code == 0 and same.stderr == ""


def test_rate_scale_on_an_all_at_once_workload_is_not_silent(tmp_path: Path) -> None:
    """Refused when it would change no workload; a note naming the ones it leaves alone
    when it changes some."""
    trace = _trace(tmp_path / "t.jsonl", n=6)
    args = ["bench", "--policies", "fcfs", "--limit", "4", "--rate-scale", "2"]
    args += ["--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")]
    result = runner.invoke(app, [*args, "-w", f"trace:{trace},shared-prefix"])
    assert result.exit_code == 0, result.output
    note = "note: --rate-scale 2 leaves shared-prefix unchanged: its requests all arrive at once"
    assert note in result.stderr
    refused = runner.invoke(app, [*args, "-w", "shared-prefix", "--json", str(tmp_path / "x")])
    assert refused.exit_code == 2 and "--rate-scale 2 changes nothing" in refused.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "args, text",
    [
        (["show", "/nonexistent.json"], "no such file"),
        (["compare", "/nonexistent.json", "/nonexistent2.json"], "no such file"),
        (["list", "gpus"], "gpus"),
    ],
)
def test_result_tools_bad_input(args: list[str], text: str, tmp_path: Path) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and text in result.stderr and result.exception is not None
    assert isinstance(result.exception, SystemExit)


def test_show_rejects_a_file_that_is_not_a_record(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"rows": 3}')
    result = runner.invoke(app, ["show", str(bad)])
    assert result.exit_code == 2 and "not a bench record" in result.stderr


def test_version_and_list() -> None:
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.stdout.startswith("feather 0.")
    listed = runner.invoke(app, ["list"])
    assert listed.exit_code == 0
    assert "hrrn" in listed.stdout and "long-prefix" in listed.stdout
    assert "h200" in listed.stdout and "measured" in listed.stdout
    assert all(len(x) <= 80 for x in listed.stdout.splitlines())


def test_arrival_poisson_on_a_generated_workload(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    args = ["bench", "-w", "no-sharing", "--arrival", "poisson:20", "--limit", "40"]
    args += ["--policies", "fcfs", "--json", str(out), "--plot", str(tmp_path / "p.png")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    (row,) = payload["rows"]
    assert row["requests"] == 40
    assert payload["config"]["workloads"]["no-sharing"]["arrival"] == "poisson:20.0"
    assert row["makespan_s"] > 1.0  # 40 arrivals at 20/s span ~2 s


def test_rates_sweep_rows_per_rate(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", 20)
    out = tmp_path / "s.json"
    args = ["bench", "-w", f"trace:{trace}", "--rates", "1,4", "--policies", "fcfs"]
    result = runner.invoke(app, [*args, "--json", str(out), "--plot", str(tmp_path / "s.png")])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["workload"] for r in rows] == [f"trace:{trace}@1/s", f"trace:{trace}@4/s"]
    assert [r["rate_req_s"] for r in rows] == [1.0, 4.0]
    assert rows[0]["makespan_s"] > rows[1]["makespan_s"]  # 20 requests over 19 s vs 4.75 s
    assert (tmp_path / "s.png").stat().st_size > 1000


def test_piped_output_streams_rows_and_fits_80_columns(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", 12)
    args = ["bench", "-w", f"trace:{trace}", "--policies", "fcfs,max-homogeneous,feather-paper"]
    args += ["--json", str(tmp_path / "o.json"), "--plot", str(tmp_path / "o.png")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    table = [x for x in lines if x.startswith(" ") or x.startswith("policy")]
    assert len(table) >= 4 and all(len(x) <= 80 for x in table)  # names may wrap, numbers fit
    assert "max-homogeneous" in result.stdout and "feather-paper" in result.stdout
    assert "[3/3]" in result.stderr  # progress on stderr when not a terminal
    assert "[3/3]" not in result.stdout


def test_docs_document_every_bench_option() -> None:
    readme = (Path(__file__).resolve().parents[1] / "docs" / "bench.md").read_text()
    bench = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    missing = [o for p in bench.params for o in p.opts if o.startswith("--") and o not in readme]
    assert not missing and "--help" not in missing


def test_public_api() -> None:
    import feather_lab
    import feather_sched
    from feather_lab import SLO, make_workload, simulate, workload_requests

    assert {"Request", "make_policy", "policy_names"} <= set(feather_sched.__all__)
    assert {"simulate", "SLO", "make_workload", "workload_requests"} <= set(feather_lab.__all__)
    reqs = workload_requests("no-sharing")[:20]
    result = simulate(reqs, "fcfs", hardware="h100-free-l2", model="llama-3.1-8b")
    row = result.summary(SLO(ttft_s=100.0))
    assert row["requests"] == 20 and row["slo_met"] == 20 and row["goodput_req_s"] > 0
    assert make_workload("long-prefix").num_prefixes == 5  # the bench's long-prefix


def test_one_slo_rule_for_the_simulator_and_the_replay():
    """`SLO.within` is the rule both goodputs count by: an unknown TTFT (no token seen)
    fails a TTFT bound, an unknown TPOT (a one-token output) meets any bound."""
    from feather_lab.sim.result import SLO

    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    assert slo.within(0.5, 0.05) and slo.within(1.0, None)
    assert not slo.within(None, 0.05) and not slo.within(1.5, 0.05)
    assert not slo.within(0.5, 0.2)
    assert SLO().within(None, None)
