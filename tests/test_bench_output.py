"""What `feather bench` prints and writes, as a user piping it sees it: every line within
80 columns, the heading, the legend before the rows, the closing summary (checked against
the JSON record's rows) and no output file replaced without a word."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feather_lab.bench.report import BOUNDS
from feather_lab.bench.summary import gains, summary_text
from feather_lab.cli import app

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["-w", "long-prefix,no-sharing", "--limit", "60", "--policies", "fcfs,lpm,feather,oracle"]


@pytest.fixture(scope="module")
def piped(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """One run as `feather bench ... | cat` (COLUMNS unset), in a folder of its own, with
    the default output names."""
    cwd = tmp_path_factory.mktemp("piped")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(ROOT / "src")
    run = subprocess.run(
        [sys.executable, "-m", "feather_lab.cli", "bench", *ARGS],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return run, cwd


def test_every_piped_line_fits_80_columns(piped) -> None:
    run, _ = piped
    for stream in (run.stdout, run.stderr):
        long = [line for line in stream.splitlines() if len(line) > 80]
        assert not long, long


def test_the_heading_names_the_profile_its_provenance_and_the_model(piped) -> None:
    run, _ = piped
    first = run.stdout.splitlines()[0]
    assert "h200 (measured)" in first and "llama-3.1-8b" in first
    assert "benchmarks/" not in run.stdout  # a record path is the JSON's business


def test_the_legend_comes_once_before_the_rows(piped) -> None:
    lines = piped[0].stdout.splitlines()
    legend = [i for i, line in enumerate(lines) if line.startswith("tok/s: output tokens/s")]
    header = [i for i, line in enumerate(lines) if line.startswith("policy ")]
    assert len(legend) == 1 and len(header) == 1
    assert legend[0] < header[0]
    assert "Higher is better" not in "\n".join(lines[header[0] :])


def test_the_summary_matches_the_records_rows(piped) -> None:
    run, cwd = piped
    rows = json.loads((cwd / "feather-bench.json").read_text())["rows"]
    summary = run.stdout[run.stdout.index("summary:") :].split("\n\n")[0].splitlines()
    printed = {line.split()[0]: line.split()[1:] for line in summary[3:]}
    assert set(printed) == {"long-prefix", "no-sharing"}
    for workload, (vs_fcfs, best, vs_best) in printed.items():
        mine = {r["policy"]: r["output_tok_s"] for r in rows if r["workload"] == workload}
        others = {p: v for p, v in mine.items() if p != "feather" and p not in BOUNDS}
        top = max(others, key=lambda p: others[p])
        assert float(vs_fcfs) == pytest.approx(mine["feather"] / mine["fcfs"], abs=0.006)
        assert mine[best] == others[top]  # the best (a tie may name either)
        assert float(vs_best) == pytest.approx(mine["feather"] / others[top], abs=0.006)


def test_the_default_plot_is_named_after_the_json(piped) -> None:
    _, cwd = piped
    assert sorted(p.name for p in cwd.iterdir()) == ["feather-bench.json", "feather-bench.png"]


def test_the_summary_leaves_references_out_and_needs_feather() -> None:
    rows = [
        {"workload": "w", "policy": "fcfs", "output_tok_s": 100.0},
        {"workload": "w", "policy": "lpm", "output_tok_s": 120.0},
        {"workload": "w", "policy": "feather", "output_tok_s": 150.0},
        {"workload": "w", "policy": "oracle", "output_tok_s": 300.0},
        {"workload": "w", "policy": "bound:unbounded-kv", "output_tok_s": 400.0},
    ]
    (gain,) = gains(rows)
    assert gain.best == "lpm"
    assert gain.vs_baseline == pytest.approx(1.5) and gain.vs_best == pytest.approx(1.25)
    assert "1.50" in summary_text(rows) and "1.25" in summary_text(rows)
    assert summary_text([r for r in rows if r["policy"] != "feather"]) == ""


def test_an_existing_output_is_never_replaced_without_a_word(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "h200.json"
    args = ["bench", "-w", "long-prefix", "--limit", "20", "--policies", "fcfs,feather"]
    first = runner.invoke(app, [*args, "--json", str(out)])
    assert first.exit_code == 0, first.output
    assert (tmp_path / "h200.png").is_file()  # the plot beside the JSON, named after it
    assert "replacing" not in first.stderr
    again = runner.invoke(app, [*args, "--json", str(out)])
    assert again.exit_code == 0, again.output
    assert f"replacing {out}" in again.stderr
    assert f"replacing {tmp_path / 'h200.png'}" in again.stderr
    assert "replacing" in runner.invoke(app, ["bench", "--help"], terminal_width=80).output
