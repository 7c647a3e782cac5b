"""`feather results`: every published figure checked against its record."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from feather_lab.cli.common import app, fail


def _print_report(report, spec, verbose: bool) -> None:
    print(
        f"{report.figures} figures checked against their records, "
        f"{len(report.mismatches)} mismatched"
    )
    for m in report.mismatches:
        print(f"  MISMATCH {m}")
    sections = [
        ("incomplete", report.incomplete, spec.strict),
        ("dirty", report.dirty, spec.strict),
        ("stale", report.stale, spec.fail_stale),
    ]
    for name, items, fails in sections:
        tag = "FAIL" if fails and items else "report"
        print(f"{len(items)} of {report.records} records {name} ({tag})")
        for item in items if verbose or fails else items[:5]:
            print(f"  {item}")
        if items and not (verbose or fails) and len(items) > 5:
            print(f"  ... {len(items) - 5} more (--verbose)")


@app.command("results")
def results_cmd(
    check: Annotated[bool, typer.Option("--check", help="Check figures, provenance, age.")] = False,
    quick: Annotated[
        bool, typer.Option("--quick", help="Re-make the simulated records and compare.")
    ] = False,
    docs: Annotated[
        list[Path] | None, typer.Option("--doc", help="A doc to check (default: README, docs/).")
    ] = None,
    root: Annotated[Path, typer.Option(help="The repository root.")] = Path("."),
    strict: Annotated[
        bool, typer.Option(help="Fail on records without command/commit/machine/date or dirty.")
    ] = False,
    fail_stale: Annotated[bool, typer.Option(help="Fail on stale records.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="List every record.")] = False,
) -> None:
    """Check that every quoted figure matches its record (--check), or re-make the simulated
    records and compare (--quick)."""
    if check == quick:
        fail(ValueError("give exactly one of --check or --quick"))
    if not (root / "benchmarks").is_dir():
        fail(ValueError(f"--root {root}: no benchmarks/ folder; give the repository root"))
    for doc in docs or ():
        if not doc.is_file():
            fail(ValueError(f"--doc {doc}: no such file"))
    if quick:
        from feather_lab.results.quick import run_quick

        raise typer.Exit(1 if run_quick(root.resolve()) else 0)
    from feather_lab.results.check import CheckSpec, run_check

    spec = CheckSpec(root.resolve(), tuple(d.resolve() for d in docs or ()), strict, fail_stale)
    report = run_check(spec)
    _print_report(report, spec, verbose)
    raise typer.Exit(1 if report.failed(spec) else 0)
