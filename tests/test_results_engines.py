"""`feather results --engines`: each piece's records re-made in place only when it succeeds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feather_lab.cli import app
from feather_lab.results.engines import jobs, listing, run_engines
from feather_lab.results.registry import load

REGISTRY = """
[[record]]
path = "benchmarks/t/a.json"
command = "python write.py benchmarks/t/a.json"
remake = "engines"
piece = "vllm"
minutes = 1

[[record]]
path = "benchmarks/t/b.json"
command = "python fail.py benchmarks/t/b.json"
remake = "engines"
piece = "sglang-loop"
minutes = 2

[[record]]
path = "benchmarks/t/c.json"
command = "python write.py benchmarks/t/c.json"
remake = "engines"
piece = "ray"
minutes = 3
"""


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "benchmarks" / "t"
    folder.mkdir(parents=True)
    for name in "abc":
        (folder / f"{name}.json").write_text(json.dumps({"old": 1}))
    (tmp_path / "benchmarks" / "records.toml").write_text(REGISTRY)
    (tmp_path / "write.py").write_text(
        "import json, sys\njson.dump({'new': 1}, open(sys.argv[1], 'w'))\n"
    )
    (tmp_path / "fail.py").write_text("raise SystemExit(3)\n")
    for var in ("FEATHER_VLLM_PYTHON", "FEATHER_SGLANG_PYTHON", "FEATHER_RAY_PYTHON"):
        monkeypatch.setenv(var, sys.executable)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_failed_piece_keeps_the_finished_ones_and_a_skipped_one_says_why(root: Path) -> None:
    todo = jobs(load(root))
    summary = root / "summary.json"
    failed = run_engines(root, todo, summary, skip=lambda p: "no ray" if p.name == "ray" else None)
    assert failed
    record = lambda n: json.loads((root / "benchmarks" / "t" / f"{n}.json").read_text())  # noqa: E731
    assert record("a") == {"new": 1} and record("b") == {"old": 1} and record("c") == {"old": 1}
    verdicts = [(r["piece"], r["verdict"]) for r in json.loads(summary.read_text())]
    assert verdicts == [("vllm", "re-made"), ("sglang-loop", "failed"), ("ray", "skipped")]
    assert "no ray" in json.loads(summary.read_text())[2]["detail"]


def test_list_shows_each_piece_with_its_estimate_and_only_picks_one(root: Path) -> None:
    text = listing(jobs(load(root)))
    assert "vllm" in text and "sglang-loop" in text and "~3 min" in text
    runner = CliRunner()
    listed = runner.invoke(app, ["results", "--engines", "--list", "--only", "ray"])
    assert listed.exit_code == 0 and "ray" in listed.output and "vllm " not in listed.output
    bad = runner.invoke(app, ["results", "--engines", "--only", "nope"])
    assert bad.exit_code == 2 and "valid: vllm, replay, sglang-loop, ray" in bad.output


def test_only_runs_that_piece_through_the_cli(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("feather_lab.results.engines.skip_reason", lambda piece: None)
    result = CliRunner().invoke(app, ["results", "--engines", "--only", "vllm"])
    assert result.exit_code == 0, result.output
    assert json.loads((root / "benchmarks/t/a.json").read_text()) == {"new": 1}
    assert json.loads((root / "benchmarks/t/c.json").read_text()) == {"old": 1}


def test_a_piece_whose_engine_is_missing_is_skipped_with_the_reason(root: Path) -> None:
    from feather_lab.results.engines import skip_reason
    from feather_lab.results.registry import EnginePiece

    piece = EnginePiece("x", "x", "FEATHER_VLLM_PYTHON", "no_such_module_here")
    assert "'no_such_module_here' is not importable" in skip_reason(piece)
    assert skip_reason(EnginePiece("x", "x", "FEATHER_VLLM_PYTHON", "json")) is None
