"""`feather results`: every published figure and table checked against its records, tables
rendered from them, and the commands that re-make the records (simulated: --quick; real
engines: --engines)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from feather_lab.cli.common import app, fail
from feather_lab.cli.options import with_options


def _print_report(report, spec, verbose: bool) -> None:
    print(
        f"{report.figures} figures checked against their records, "
        f"{len(report.mismatches)} mismatched"
    )
    for m in report.mismatches:
        print(f"  MISMATCH {m}")
    print(
        f"{report.tables} tables checked against their rendering, "
        f"{len(report.table_problems)} differ"
    )
    for problem in report.table_problems:
        print(f"  TABLE {problem}")
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


def _render(root: Path, docs: list[Path]) -> None:
    """Rewrite every table block of `docs` from its records and say which changed."""
    from feather_lab.results.blocks import render_docs

    changed, problems = render_docs(docs, root)
    for block in changed:
        print(f"  rendered {block.doc}:{block.line}: table {block.name!r}")
    for problem in problems:
        print(f"  TABLE {problem}")
    print(f"{len(changed)} tables rewritten from their records, {len(problems)} not renderable")
    raise typer.Exit(1 if problems else 0)


def _flag(name: str, text: str) -> tuple[object, bool]:
    return Annotated[bool, typer.Option(name, help=text)], False


def _valued(kind: object, default: object, *flags: str, **settings: Any) -> tuple[object, object]:
    return Annotated[kind, typer.Option(*flags, **settings)], default


OPTIONS = {
    "check": _flag("--check", "Check figures, tables, provenance, age."),
    "render": _flag("--render", "Rewrite every table block from its records."),
    "quick": _flag("--quick", "Re-make the simulated records and compare."),
    "engines": _flag("--engines", "Re-make the real-engine records (hours)."),
    "refresh": _flag("--refresh", "--quick: replace each record re-made identical."),
    "accept": _flag("--accept", "--quick: replace every record re-made, differing ones too."),
    "jobs": _valued(int, 0, "--jobs", help="--quick: pieces at once (default: CPU count)."),
    "only": _valued(str | None, None, "--only", help="--engines: run this piece only."),
    "list_only": _flag("--list", "--engines: list the pieces and their time."),
    "docs": _valued(
        list[Path] | None,
        None,
        "--doc",
        help="A doc to check (default: README, docs/, benchmarks/).",
    ),
    "root": _valued(Path, Path("."), help="The repository root."),
    "allow_stale": _flag(
        "--allow-stale", "--check: report stale, incomplete and dirty records without failing."
    ),
    "verbose": _flag("--verbose", "List every record."),
}
"""`feather results`' options: name -> (annotation, default)."""


def _refuse(o: dict[str, Any]) -> None:
    """Options that do not go together, or a root or doc that is not there (exit 2)."""
    if o["check"] + o["render"] + o["quick"] + o["engines"] != 1:
        fail(ValueError("give exactly one of --check, --render, --quick or --engines"))
    if (o["refresh"] or o["accept"] or o["jobs"]) and not o["quick"]:
        fail(ValueError("--refresh, --accept and --jobs go with --quick"))
    if o["jobs"] < 0:
        fail(ValueError(f"--jobs {o['jobs']}: give a count of 1 or more (0: one per CPU)"))
    if (o["only"] is not None or o["list_only"]) and not o["engines"]:
        fail(ValueError("--only and --list go with --engines"))
    if not (o["root"] / "benchmarks").is_dir():
        fail(ValueError(f"--root {o['root']}: no benchmarks/ folder; give the repository root"))
    for doc in o["docs"] or ():
        if not doc.is_file():
            fail(ValueError(f"--doc {doc}: no such file"))


@app.command("results")
@with_options(OPTIONS)
def results_cmd(**o: Any) -> None:
    """Check every quoted figure and rendered table against its records and every record's
    provenance and age (--check), or rewrite the tables from their records (--render), or
    re-make the simulated records and compare (--quick), or re-make the real-engine records
    (--engines)."""
    _refuse(o)
    root, docs = o["root"].resolve(), o["docs"]
    if o["engines"]:
        _engines(root, o["only"], o["list_only"])
    if o["quick"]:
        from feather_lab.results.quick import QuickSpec, run_quick

        jobs = o["jobs"] or os.cpu_count() or 1
        spec = QuickSpec(root, jobs=jobs, refresh=o["refresh"], accept=o["accept"])
        raise typer.Exit(1 if run_quick(spec) else 0)
    from feather_lab.results.check import CheckSpec, default_docs, run_check

    if o["render"]:
        _render(root, [d.resolve() for d in docs or default_docs(root)])
    spec = CheckSpec(root, tuple(d.resolve() for d in docs or ()), o["allow_stale"])
    report = run_check(spec)
    _print_report(report, spec, o["verbose"])
    raise typer.Exit(1 if report.failed(spec) else 0)
