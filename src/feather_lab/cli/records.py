"""`feather list`, `show` and `compare`: the names the bench takes, and saved records."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from feather_lab.cli.common import (
    app,
    fail,
)


@app.command("list")
def list_cmd(
    what: Annotated[
        str | None,
        typer.Argument(help="policies, workloads, hardware or models (default: all)."),
    ] = None,
) -> None:
    """The names `feather bench` takes: policies, workloads, hardware and model profiles."""
    from feather_lab.bench.results import catalogue

    cat = catalogue()
    if what is not None and what not in cat:
        fail(ValueError(f"nothing called {what!r} to list; valid: {', '.join(cat)}"))
    for section, items in cat.items():
        if what is not None and section != what:
            continue
        print(f"{section}:")
        for name, line in items:
            print(f"  {name:<18} {line}".rstrip())


@app.command("show")
def show_cmd(
    record: Annotated[Path, typer.Argument(help="A `feather bench --json` record.")],
    csv_out: Annotated[bool, typer.Option("--csv", help="Every row field as CSV.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="A Markdown table.")] = False,
) -> None:
    """Print a saved bench record: its table (default), CSV or Markdown."""
    from feather_lab.bench.output import results_legend, results_text, terminal_width
    from feather_lab.bench.results import read_record, rows_csv, rows_markdown

    if csv_out and markdown:
        fail(ValueError("--csv and --markdown: pick one"))
    try:
        payload = read_record(record)
    except ValueError as err:
        fail(err)
    rows = payload["rows"]
    if csv_out:
        sys.stdout.write(rows_csv(rows))
    elif markdown:
        print(rows_markdown(rows))
    else:
        cfg = payload.get("config") or {}
        title = f"{record}: " + ", ".join(
            f"{k} {cfg[k]}" for k in ("replicas", "hardware", "model", "kernel", "seed") if k in cfg
        )
        print(results_text(rows, title, terminal_width()))
        print(results_legend(rows))


@app.command("compare")
def compare_cmd(
    a: Annotated[Path, typer.Argument(help="Record A (the reference).")],
    b: Annotated[Path, typer.Argument(help="Record B.")],
) -> None:
    """Two saved bench records side by side: each (workload, policy) in both, B / A."""
    from feather_lab.bench.results import compare_text, read_record
    from feather_lab.cli.compare_checks import common_pairs, setup_warning

    try:
        ra, rb = read_record(a), read_record(b)
        common_pairs(ra, rb, str(a), str(b))
    except ValueError as err:
        fail(err)
    warning = setup_warning(ra, rb)
    if warning is not None:
        print(warning, file=sys.stderr)
    print(compare_text(ra["rows"], rb["rows"], str(a), str(b)))
