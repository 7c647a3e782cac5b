"""Result columns declared once (`bench.columns`) and rows read through `bench.rows.Row`: the
best-row marks and their tie rule, units, the legend, old records still read, and
`feather compare` pairing cluster rows by router."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feather_lab.bench.columns import (
    BEST_MARK,
    COLUMNS,
    LEGEND,
    TIE_MARK,
    best_marks,
    column,
    columns_of,
    legend,
)
from feather_lab.bench.output import results_text, workload_block
from feather_lab.bench.results import compare_text, rows_markdown
from feather_lab.bench.rows import CLUSTER, ENGINE, Row, as_rows
from feather_lab.cli import app

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _rows(*tok_s: float, workload: str = "w", **extra: object) -> list[Row]:
    return as_rows(
        {"workload": workload, "policy": f"p{i}", "output_tok_s": v, **extra}
        for i, v in enumerate(tok_s)
    )


@pytest.mark.parametrize(
    "tok_s, marks",
    [
        ((5164.0, 5186.0, 5170.0), ["", BEST_MARK, ""]),
        # 5,186 both as printed: a tie, marked as such; the rest unmarked
        ((5164.0, 5186.2, 5185.9), ["", TIE_MARK, TIE_MARK]),
        # every row the same as printed: no row is better than another
        ((10944.0,) * 8, [""] * 8),
        ((10944.2, 10943.9, 10944.4), ["", "", ""]),
        ((7.0,), [BEST_MARK]),
        ((float("nan"), 3.0, 2.0), ["", BEST_MARK, ""]),
    ],
)
def test_best_marks_judge_the_printed_value(tok_s: tuple[float, ...], marks: list[str]) -> None:
    rows = _rows(*tok_s)
    assert best_marks(rows, columns_of(ENGINE)) == marks


def test_a_bound_is_never_the_best() -> None:
    bound = Row.of({"workload": "w", "policy": "bound:x", "output_tok_s": 500})
    rows = [*_rows(100.0, 90.0), bound]
    assert best_marks(rows, columns_of(ENGINE)) == [BEST_MARK, "", ""]
    lines = workload_block(rows, columns_of(ENGINE, wide=False))
    assert lines[1].startswith(" p0*") and lines[3].startswith(" bound:x ")


def test_tied_rows_print_the_tie_mark_and_the_legend_says_so() -> None:
    text = results_text(_rows(10.0, 12.001, 11.999), "t")
    lines = text.splitlines()
    assert lines[4].startswith(" p1=") and lines[5].startswith(" p2=")
    assert BEST_MARK not in text
    for words in ("as printed", f"{TIE_MARK} tied for best", "no mark when all tie"):
        assert words in " ".join(LEGEND.split())


def test_tpot_is_printed_in_milliseconds() -> None:
    tpot = column("tpot_p99_s")
    assert tpot.unit == "ms"
    assert [tpot.text(v) for v in (0.0367, 0.0062, 0.3096)] == ["36.7", "6.20", "310"]
    assert "tpot99: time per output token p99, ms" in " ".join(LEGEND.split())


def test_every_column_is_declared_once_and_described() -> None:
    for kind in (ENGINE, CLUSTER):
        cols = columns_of(kind, "pow2")
        assert len({c.key for c in cols}) == len(cols)
        assert len({c.header for c in cols}) == len(cols)
        assert sum(c.best for c in cols) == 1
        text = " ".join(legend(kind, "pow2").split())
        assert all(f"{c.header}: {c.description}" in text for c in cols)
    assert all(c.better in ("higher", "lower", None) for c in COLUMNS)


def test_sim_rows_have_every_declared_engine_column(tmp_path: Path) -> None:
    """The columns the simulator's table shows are fields its rows carry."""
    out = tmp_path / "r.json"
    args = ["bench", "-w", "document-qa", "--policies", "fcfs,grouped", "--limit", "16"]
    result = runner.invoke(app, [*args, "--json", str(out), "--plot", str(tmp_path / "r.png")])
    assert result.exit_code == 0, result.output
    row = json.loads(out.read_text())["rows"][0]
    assert not {c.key for c in columns_of(ENGINE) if c.key not in row}
    assert f"{TIE_MARK} tied for best" in " ".join(result.stdout.split())


def test_a_row_reads_back_as_written() -> None:
    fields = {"workload": "w", "max_num_seqs": 8, "router": "pow2", "policy": "fcfs", "x": [1]}
    row = Row.of(fields)
    assert row.to_json() == fields and list(row.to_json()) == list(fields)
    assert (row.kind, row.name, row.label) == (CLUSTER, "pow2/fcfs", "pow2/fcfs")
    oracle = Row.of({"workload": "w", "policy": "oracle", "oracle_cap": 64})
    assert (oracle.kind, oracle.name, oracle.label) == (ENGINE, "oracle", "oracle (cap 64)")


def _records() -> list[Path]:
    found = []
    for path in sorted(REPO.glob("benchmarks/**/*.json")):
        payload = json.loads(path.read_text())
        rows = payload.get("rows") if isinstance(payload, dict) else None
        if isinstance(rows, list) and rows and all({"workload", "policy"} <= set(r) for r in rows):
            found.append(path)
    return found


@pytest.mark.parametrize("path", _records(), ids=lambda p: p.name)
def test_saved_records_still_show_and_compare(path: Path) -> None:
    """Every record under benchmarks/ (old ones included) reads in `show` and `compare`."""
    for args in (["show", str(path)], ["show", "--markdown", str(path)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    cmp = runner.invoke(app, ["compare", str(path), str(path)])
    assert cmp.exit_code == 0 and "1.000x" in cmp.stdout


def _cluster(replicas: int, feather_tok_s: float) -> list[dict]:
    rows = []
    for router, policy, tok_s in (("pow2", "fcfs", 100.0), ("pa", "fcfs", 150.0)):
        rows.append({"workload": "w", "router": router, "policy": policy, "output_tok_s": tok_s})
    rows.append({"workload": "w", "router": "feather", "policy": "feather"})
    rows[-1]["output_tok_s"] = feather_tok_s
    for r in rows:
        r["replicas"] = replicas
    return rows


def test_compare_pairs_cluster_rows_by_router_across_replica_counts() -> None:
    text = compare_text(_cluster(4, 200.0), _cluster(8, 300.0), "a", "b")
    assert "w / pow2/fcfs" in text and "w / pa/fcfs" in text and "w / feather/feather" in text
    assert "1.500x" in text and "only in" not in text
    md = rows_markdown(_cluster(4, 200.0))
    assert "| w | 4 | feather/feather* | 200 |" in md


def test_sglang_client_does_not_import_the_engine() -> None:
    """The harness's shared types live in sglang_spec: no import circle."""
    src = REPO / "src/feather_lab/harness/sglang_client.py"
    imported = {
        node.module
        for node in ast.walk(ast.parse(src.read_text()))
        if isinstance(node, ast.ImportFrom)
    }
    assert "feather_lab.harness.sglang_engine" not in imported
    assert "feather_lab.harness.sglang_spec" in imported
