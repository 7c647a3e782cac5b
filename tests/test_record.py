"""Every record names how it was made, and none is made from uncommitted code unless asked."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feather_lab.bench import record
from feather_lab.cli import app


@pytest.fixture
def dirty_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree with one changed file, and no one allowing a record made from it."""
    monkeypatch.setattr(record, "changed_files", lambda: ("src/feather_sched/host/x.py",))
    monkeypatch.delenv(record.ALLOW_VAR, raising=False)


def test_a_record_names_its_command_commit_date_and_machine(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    record.write_record(out, rows=[{"a": 1}])
    payload = json.loads(out.read_text())
    stamp = payload["provenance"]
    assert payload["machine"]["cores"] >= 1 and payload["rows"] == [{"a": 1}]
    assert stamp["command"] and stamp["commit"]
    assert datetime.fromisoformat(stamp["date"]).utcoffset().total_seconds() == 0


def test_a_record_command_on_a_dirty_tree_exits_2_naming_the_files_before_any_work(
    dirty_tree: None, tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", "--workload", "chat", "--json", str(out), "--plot", str(tmp_path / "p.png")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "src/feather_sched/host/x.py" in result.output and "--allow-dirty" in result.output
    assert not out.exists()
    with pytest.raises(record.DirtyTree, match=r"host/x\.py"):
        record.write_record(out, rows=[])


def test_allowed_a_dirty_record_says_so(
    dirty_tree: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(record.ALLOW_VAR, "1")
    record.write_record(tmp_path / "r.json", rows=[])
    assert json.loads((tmp_path / "r.json").read_text())["provenance"]["dirty"] is True


def test_a_clean_record_has_no_dirty_mark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record, "changed_files", lambda: ())
    monkeypatch.delenv(record.ALLOW_VAR, raising=False)
    record.write_record(tmp_path / "r.json", rows=[])
    stamp = json.loads((tmp_path / "r.json").read_text())["provenance"]
    assert "dirty" not in stamp and not stamp["commit"].endswith("+dirty")


def test_a_script_guard_refuses_a_dirty_tree_and_takes_the_flag(
    dirty_tree: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["benchmarks/sim/sim_speed.py", "--json", "o.json"])
    with pytest.raises(SystemExit) as stop:
        record.guard()
    assert stop.value.code == 2
    argv = ["benchmarks/sim/sim_speed.py", "--allow-dirty", "--json", "o.json"]
    monkeypatch.setattr(sys, "argv", argv)
    record.guard()
    assert sys.argv == ["benchmarks/sim/sim_speed.py", "--json", "o.json"]
    assert record.dirty_allowed()
    assert record.command_line() == "python benchmarks/sim/sim_speed.py --allow-dirty --json o.json"


def test_the_cli_command_line_reads_feather() -> None:
    for head in ("/venv/bin/feather", "/r/src/feather_lab/cli/__main__.py"):
        argv = [head, "bench", "--json", "a b.json"]
        assert record.command_line(argv) == "feather bench --json 'a b.json'"
