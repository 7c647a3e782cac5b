"""`feather results`: every published figure checked against its record, and the commands
that re-make the records (simulated: --quick; real engines: --engines)."""

from __future__ import annotations

import os
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
    for problem in report.registry:
        print(f"  REGISTRY {problem}")
    fails = not spec.allow_stale
    for name, items in (
        ("incomplete", report.incomplete),
        ("dirty", report.dirty),
        ("stale", report.stale),
    ):
        tag = "FAIL" if fails and items else "report"
        print(f"{len(items)} of {report.records} records {name} ({tag})")
        for item in items if verbose or fails else items[:5]:
            print(f"  {item}")
        if items and not (verbose or fails) and len(items) > 5:
            print(f"  ... {len(items) - 5} more (--verbose)")


def _engines(root: Path, only: str | None, list_only: bool) -> None:
    from feather_lab.bench.record import require_clean
    from feather_lab.results.engines import jobs, listing, run_engines
    from feather_lab.results.registry import PIECES, load

    names = [p.name for p in PIECES]
    if only is not None and only not in names:
        fail(ValueError(f"--only {only!r}: no such piece; valid: {', '.join(names)}"))
    try:
        todo = [j for j in jobs(load(root)) if only is None or j.piece.name == only]
    except ValueError as err:
        fail(err)
    if list_only:
        print(listing(todo))
        raise typer.Exit(0)
    try:
        require_clean()
    except ValueError as err:
        fail(err)
    raise typer.Exit(1 if run_engines(root, todo, Path("results-engines.json")) else 0)


@app.command("results")
def results_cmd(
    check: Annotated[bool, typer.Option("--check", help="Check figures, provenance, age.")] = False,
    quick: Annotated[
        bool, typer.Option("--quick", help="Re-make the simulated records and compare.")
    ] = False,
    engines: Annotated[
        bool, typer.Option("--engines", help="Re-make the real-engine records (hours).")
    ] = False,
    refresh: Annotated[
        bool,
        typer.Option("--refresh", help="--quick: replace each record re-made identical."),
    ] = False,
    accept: Annotated[
        bool,
        typer.Option("--accept", help="--quick: replace every record re-made, differing ones too."),
    ] = False,
    jobs: Annotated[
        int, typer.Option("--jobs", help="--quick: pieces at once (default: CPU count).")
    ] = 0,
    only: Annotated[
        str | None, typer.Option("--only", help="--engines: run this piece only.")
    ] = None,
    list_only: Annotated[
        bool, typer.Option("--list", help="--engines: list the pieces and their time.")
    ] = False,
    docs: Annotated[
        list[Path] | None, typer.Option("--doc", help="A doc to check (default: README, docs/).")
    ] = None,
    root: Annotated[Path, typer.Option(help="The repository root.")] = Path("."),
    allow_stale: Annotated[
        bool,
        typer.Option(
            "--allow-stale",
            help="--check: report stale, incomplete and dirty records without failing.",
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="List every record.")] = False,
) -> None:
    """Check every quoted figure against its record and every record's provenance and age
    (--check), or re-make the simulated records and compare (--quick), or re-make the
    real-engine records (--engines)."""
    if check + quick + engines != 1:
        fail(ValueError("give exactly one of --check, --quick or --engines"))
    if (refresh or accept or jobs) and not quick:
        fail(ValueError("--refresh, --accept and --jobs go with --quick"))
    if jobs < 0:
        fail(ValueError(f"--jobs {jobs}: give a count of 1 or more (0: one per CPU)"))
    if (only is not None or list_only) and not engines:
        fail(ValueError("--only and --list go with --engines"))
    if not (root / "benchmarks").is_dir():
        fail(ValueError(f"--root {root}: no benchmarks/ folder; give the repository root"))
    for doc in docs or ():
        if not doc.is_file():
            fail(ValueError(f"--doc {doc}: no such file"))
    if engines:
        _engines(root.resolve(), only, list_only)
    if quick:
        from feather_lab.results.quick import QuickSpec, run_quick

        spec = QuickSpec(
            root.resolve(), jobs=jobs or os.cpu_count() or 1, refresh=refresh, accept=accept
        )
        raise typer.Exit(1 if run_quick(spec) else 0)
    from feather_lab.results.check import CheckSpec, run_check

    spec = CheckSpec(root.resolve(), tuple(d.resolve() for d in docs or ()), allow_stale)
    report = run_check(spec)
    _print_report(report, spec, verbose)
    raise typer.Exit(1 if report.failed(spec) else 0)
