"""`feather results --check`: each quoted figure and rendered table against its records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feather_lab.cli import app
from feather_lab.results.blocks import check_tables
from feather_lab.results.check import default_docs
from feather_lab.results.figures import check_docs, evaluate, find_figures, lookup, render
from feather_lab.results.tables import TABLES, Table, markdown

ROOT = Path(__file__).resolve().parents[1]
DOCS = list(default_docs(ROOT))


def test_the_repository_figures_match_their_records() -> None:
    checked, bad = check_docs(DOCS, ROOT)
    assert checked >= 5, "the README's results table names its records"
    assert bad == [], "\n".join(map(str, bad))


MADE = {"command": "python make.py", "commit": "0" * 40, "date": "2026-01-01T00:00:00+00:00"}


def _tree(tmp_path: Path, figure: str) -> Path:
    record = tmp_path / "benchmarks" / "t" / "r.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"machine": {"cpu": "x"}, "ab": [{"b_over_a": 2.837}], **MADE}))
    (tmp_path / "benchmarks" / "records.toml").write_text(
        '[[record]]\npath = "benchmarks/t/r.json"\nremake = "by-hand"\n'
    )
    (tmp_path / "README.md").write_text(
        f"| gain | {figure}<!-- record: benchmarks/t/r.json ab[0].b_over_a .2f -->x |\n"
    )
    return tmp_path


def test_a_broken_figure_in_a_copy_of_the_readme_fails_by_name(tmp_path: Path) -> None:
    copy = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", copy)
    first = find_figures(ROOT / "README.md", ROOT)[0]
    text = copy.read_text()
    mark = text.index("<!-- figure:")
    broken = text[: mark - len(first.quoted)] + "9.99" + text[mark:]
    copy.write_text(broken)
    result = CliRunner().invoke(
        app, ["results", "--check", "--root", str(ROOT), "--doc", str(copy)]
    )
    assert result.exit_code == 1, result.output
    assert "MISMATCH" in result.output and "'9.99'" in result.output
    assert f"the record says {first.quoted}" in result.output


def test_a_matching_figure_passes_and_a_drifted_one_fails(tmp_path: Path) -> None:
    good = CliRunner().invoke(app, ["results", "--check", "--root", str(_tree(tmp_path, "2.84"))])
    assert good.exit_code == 0, good.output
    (tmp_path / "README.md").unlink()
    shutil.rmtree(tmp_path / "benchmarks")
    bad = CliRunner().invoke(app, ["results", "--check", "--root", str(_tree(tmp_path, "2.83"))])
    assert bad.exit_code == 1 and "README.md:1: '2.83'" in bad.output


def test_a_mark_naming_a_missing_record_or_path_fails(tmp_path: Path) -> None:
    _tree(tmp_path, "2.84")
    doc = tmp_path / "README.md"
    doc.write_text(
        "1.0<!-- record: benchmarks/t/none.json ab[0].b_over_a .1f -->\n"
        "1.0<!-- record: benchmarks/t/r.json ab[3].b_over_a .1f -->\n"
    )
    _, bad = check_docs([doc], tmp_path)
    assert [b.reason.split(" ")[0] for b in bad] == ["no", "cannot"]


def test_bad_options_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["results"]).exit_code == 2
    assert runner.invoke(app, ["results", "--check", "--root", str(tmp_path)]).exit_code == 2


def _rewrite(tmp_path: Path, **fields: object) -> None:
    record = tmp_path / "benchmarks" / "t" / "r.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), **fields}))


def test_a_record_without_date_or_from_a_dirty_tree_fails_unless_allowed(tmp_path: Path) -> None:
    runner = CliRunner()
    check = ["results", "--check", "--root", str(_tree(tmp_path, "2.84"))]
    for fields in ({"date": None}, {"commit": "0" * 40 + "+dirty"}):
        _rewrite(tmp_path, **{**MADE, **fields})
        failed = runner.invoke(app, check)
        assert failed.exit_code == 1 and "(FAIL)" in failed.output, failed.output
        assert "benchmarks/t/r.json" in failed.output
        assert runner.invoke(app, [*check, "--allow-stale"]).exit_code == 0


def test_an_unregistered_record_fails_even_when_stale_is_allowed(tmp_path: Path) -> None:
    _tree(tmp_path, "2.84")
    (tmp_path / "benchmarks" / "t" / "other.json").write_text(json.dumps({**MADE, "machine": 1}))
    args = ["results", "--check", "--allow-stale", "--root", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "benchmarks/t/other.json: not in" in result.output


def test_the_repository_registers_every_record_with_its_remaking() -> None:
    from feather_lab.results.check import CheckSpec, run_check

    report = run_check(CheckSpec(ROOT, allow_stale=True))
    assert report.registry == [] and report.mismatches == []


def test_a_range_and_a_median_render_from_the_record(tmp_path: Path) -> None:
    record = tmp_path / "benchmarks" / "t" / "r.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"a": [1.0, 2.0, 4.0], "b": 2.0}))
    expr = "range(median(a[0] / b, a[1] / b), a[2] / b)"
    doc = tmp_path / "README.md"
    doc.write_text(f"0.75-2.00<!-- record: benchmarks/t/r.json {expr} .2f -->x\n")
    assert check_docs([doc], tmp_path) == (1, [])
    doc.write_text(f"0.75-2.10<!-- record: benchmarks/t/r.json {expr} .2f -->x\n")
    _, bad = check_docs([doc], tmp_path)
    assert [b.reason for b in bad] == ["the record says 0.75-2.00"]


def test_quick_sends_a_record_to_scratch_and_keeps_an_input_of_the_same_name() -> None:
    from feather_lab.results.quick import argv, pieces

    rec = "benchmarks/sim/check.json"
    words = argv(f"python benchmarks/sim/sim_check.py {rec} --against {rec}", Path("/s/o"), rec)
    assert words[1:] == ["benchmarks/sim/sim_check.py", "/s/o", "--against", rec]
    side = argv("feather bench --steps-out steps.jsonl --json r.json", Path("/s/r.json"), "r.json")
    assert "steps.jsonl" not in side and "/s/r.steps.jsonl" in side
    found = pieces(ROOT)
    assert len(found) >= 20 and all(p.command.split()[0] in ("feather", "python") for p in found)


def test_refresh_replaces_only_a_record_re_made_identical_and_accept_any(tmp_path: Path) -> None:
    from feather_lab.results.quick import Piece, QuickSpec, run_piece

    (tmp_path / "src").mkdir()
    maker = tmp_path / "make.py"
    maker.write_text(
        "import json, sys\n"
        "rows = [{'x': int(sys.argv[2])}]\n"
        "json.dump({'provenance': {'command': sys.argv}, 'rows': rows}, open(sys.argv[1], 'w'))\n"
    )
    record = tmp_path / "r.json"
    record.write_text(json.dumps({"provenance": {"command": "old"}, "rows": [{"x": 1}]}))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    refresh = QuickSpec(tmp_path, refresh=True)
    differs = run_piece(Piece("r.json", "python make.py OUT 2"), refresh, scratch)
    assert differs["verdict"] == "differs"
    assert json.loads(record.read_text())["provenance"]["command"] == "old"
    same = run_piece(Piece("r.json", "python make.py OUT 1"), refresh, scratch)
    assert same["verdict"] == "identical"
    assert json.loads(record.read_text())["provenance"]["command"] == "python make.py OUT 1"
    accept = QuickSpec(tmp_path, accept=True)
    moved = run_piece(Piece("r.json", "python make.py OUT 3"), accept, scratch)
    assert moved["verdict"] == "accepted" and "recorded 1, re-made 3" in moved["detail"]
    assert json.loads(record.read_text())["rows"] == [{"x": 3}]


def _repo_with_two_commits(tmp_path: Path) -> tuple[Path, str, str]:
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True)
        return done.stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    code = tmp_path / "src" / "feather_sched" / "policies" / "p.py"
    code.parent.mkdir(parents=True)
    code.write_text("A = 1\n")
    git("add", ".")
    git("commit", "-qm", "policy")
    made = git("rev-parse", "HEAD")
    code.write_text("A = 1  # why\n")
    git("commit", "-qam", "comment")
    return tmp_path, made, git("rev-parse", "HEAD")


def test_a_commit_declared_unchanged_does_not_age_a_record(tmp_path: Path) -> None:
    from feather_lab.results import staleness

    root, made, comment = _repo_with_two_commits(tmp_path)
    record = "benchmarks/sim/r.json"
    assert comment[:7] in (staleness.stale_reason(root, record, made) or "")
    staleness.last_change.cache_clear()
    staleness.unchanged_commits.cache_clear()
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "unchanged.toml").write_text(
        f'[[commit]]\nid = "{comment}"\nwhy = "a comment"\n'
    )
    assert staleness.stale_reason(root, record, made) is None
    staleness.last_change.cache_clear()
    staleness.unchanged_commits.cache_clear()
    (root / "benchmarks" / "unchanged.toml").write_text('[[commit]]\nid = "abc"\nwhy = ""\n')
    try:
        staleness.unchanged_commits(root)
    except ValueError as err:
        assert "40 hex digits" in str(err)
    else:
        raise AssertionError("a malformed entry must be refused")
    staleness.unchanged_commits.cache_clear()


def test_a_registered_measures_list_replaces_the_folder_s(tmp_path: Path) -> None:
    """A real-engine record in a folder that also holds simulations ages with what it runs:
    a policy change ages it, a change outside its list does not."""
    from feather_lab.results import staleness

    root, made, comment = _repo_with_two_commits(tmp_path)
    record = "benchmarks/cluster/r.json"
    policies = ("src/feather_sched/policies",)
    assert comment[:7] in (staleness.stale_reason(root, record, made, policies) or "")
    assert staleness.stale_reason(root, record, made, ("src/feather_sched/ray",)) is None
    staleness.last_change.cache_clear()


def test_the_registry_reads_measures_as_a_tuple(tmp_path: Path) -> None:
    from feather_lab.results.registry import load

    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "records.toml").write_text(
        '[[record]]\npath = "benchmarks/x/r.json"\nremake = "by-hand"\ncommand = "c"\n'
        'measures = ["src/a", "src/b"]\n'
    )
    assert load(tmp_path)[0].measures == ("src/a", "src/b")


def test_a_piece_that_reads_another_piece_s_record_runs_after_it() -> None:
    from feather_lab.results.quick import Piece, inputs, pieces

    todo = [Piece("a.json", "python a.py a.json"), Piece("b.json", "python b.py x=a.json b.json")]
    assert inputs(todo[1], todo) == {"a.json"} and inputs(todo[0], todo) == set()
    regret = next(p for p in pieces(ROOT) if p.record.endswith("feather-regret.json"))
    assert "benchmarks/sim/bench-a100.json" in inputs(regret, pieces(ROOT))


def test_a_piece_timed_on_this_machine_runs_alone_after_the_rest() -> None:
    from feather_lab.results.quick import Piece, _ready, pieces

    timed, a, b = Piece("t.json", "python t.py", alone=True), Piece("a.json", "x"), Piece("b", "y")
    todo = [timed, a, b]
    assert _ready([timed, a, b], {}, {}, todo) == [a, b]
    assert _ready([timed], {"future": a}, {}, todo) == []
    assert _ready([timed, Piece("u", "z", alone=True)], {}, {}, todo) == [timed]
    assert any(p.alone for p in pieces(ROOT))


def test_quick_leaves_machine_timed_fields_out_and_compares_simulated_times() -> None:
    from feather_lab.results.quick import first_difference

    assert first_difference({"router_us_per_request": 4.1}, {"router_us_per_request": 1.9}) is None
    assert first_difference({"ttft_p99_s": 1.0}, {"ttft_p99_s": 2.0}) is not None


def test_an_unknown_figure_name_is_reported(tmp_path: Path) -> None:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "figures.toml").write_text("[figure]\n")
    doc = tmp_path / "README.md"
    doc.write_text("1.50<!-- figure: nowhere -->x\n")
    checked, bad = check_docs([doc], tmp_path)
    assert checked == 1 and "no figure 'nowhere'" in bad[0].reason


def test_the_repository_tables_match_their_records() -> None:
    checked, bad = check_tables(DOCS, ROOT)
    assert checked >= 9, "benchmarks/sim and benchmarks/feather render their tables"
    assert bad == [], "\n".join(map(str, bad))


def test_a_row_is_named_by_its_fields() -> None:
    data = {"rows": [{"w": "a", "p": "x", "v": 1}, {"w": "a", "p": "y", "v": 2}]}
    assert lookup(data, "rows[w=a,p=y].v") == 2
    with pytest.raises(KeyError, match="2 rows match"):
        lookup(data, "rows[w=a].v")
    assert evaluate(data, "min(rows[*].v / rows[p=y].v)") == 0.5
    assert evaluate(data, "range(rows[*].v)") == (1.0, 2.0)
    data["rows"].append({"w": "b"})  # a row without `v` is passed over, not an error
    assert evaluate(data, "max(rows[*].v)") == 2.0
    with pytest.raises(KeyError, match="no element has"):
        lookup(data, "rows[*].u")
    with pytest.raises(ValueError, match="outside"):
        render(evaluate(data, "rows[*].v"), ".2f")


def _gain_table(record: dict) -> str:
    return markdown(["row", "gain"], "lr", [["ab", f"{record['ab'][0]['b_over_a']:.2f}"]])


BLOCK = "intro\n<!-- table: t-gain -->\n| row | gain |\n|---|---:|\n| ab | {} |\n<!-- /table -->\n"


@pytest.fixture
def gain_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tree whose README renders the table `t-gain` from benchmarks/t/r.json (2.837)."""
    monkeypatch.setitem(TABLES, "t-gain", Table("t-gain", ("benchmarks/t/r.json",), _gain_table))
    _tree(tmp_path, "2.84")
    return tmp_path


def test_a_drifted_table_fails_by_name_and_render_rewrites_it(gain_table: Path) -> None:
    readme = gain_table / "README.md"
    readme.write_text(BLOCK.format("2.80"))
    runner = CliRunner()
    check = ["results", "--check", "--root", str(gain_table)]
    failed = runner.invoke(app, check)
    assert failed.exit_code == 1, failed.output
    assert "TABLE README.md:2: table 't-gain': line 5 reads '| ab | 2.80 |'" in failed.output
    rendered = runner.invoke(app, ["results", "--render", "--root", str(gain_table)])
    assert rendered.exit_code == 0, rendered.output
    assert "rendered README.md:2: table 't-gain'" in rendered.output
    assert readme.read_text() == BLOCK.format("2.84")
    assert runner.invoke(app, check).exit_code == 0
    again = runner.invoke(app, ["results", "--render", "--root", str(gain_table)])
    assert "0 tables rewritten" in again.output


def test_an_unknown_or_unclosed_table_is_reported(gain_table: Path) -> None:
    readme = gain_table / "README.md"
    readme.write_text(
        "<!-- table: nowhere -->\n| a |\n<!-- /table -->\n"
        "A block opens with `<!-- table: NAME -->` on a line of its own.\n"  # quoted: no block
        "<!-- table: t-gain -->\n"
    )
    checked, bad = check_tables([readme], gain_table)
    assert checked == 2
    assert [str(b) for b in bad] == [
        "README.md:1: table 'nowhere': no such table (feather_lab.results.tables names them)",
        "README.md:5: table 't-gain': no <!-- /table --> closes it",
    ]
    rendered = CliRunner().invoke(app, ["results", "--render", "--root", str(gain_table)])
    assert rendered.exit_code == 1 and "table 'nowhere'" in rendered.output
