"""What every `feather` command shares: the app, its consoles, the failure rule (a message
on stderr and exit status 2, as the option parser's own errors) and option parsing helpers
(the options themselves: `cli.options`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(
    help="Feather: prefix-homogeneity-aware scheduling for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
)
trace_app = typer.Typer(help="Inspect request traces (Mooncake JSONL or Feather JSONL).")
app.add_typer(trace_app, name="trace")
console = Console(width=None if sys.stdout.isatty() else 150)
err_console = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        from feather_lab.bench.machine import git_commit, package_version

        commit = git_commit()
        print(f"feather {package_version()}" + (f" (git {commit})" if commit else ""))
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version."
        ),
    ] = False,
) -> None:
    """Feather: prefix-homogeneity-aware scheduling for LLM serving."""


def names(items: Sequence[str] | None) -> list[str]:
    """Names from an option that may be repeated and comma-separated; blanks dropped."""
    return [w.strip() for item in (items or []) for w in item.split(",") if w.strip()]


def int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{option} expects comma-separated integers, got {text!r}"
        ) from None
    if any(v < 1 for v in values):
        raise typer.BadParameter(f"{option} values must be >= 1, got {text!r}")
    return values


def float_list(text: str, option: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{option} expects comma-separated numbers, got {text!r}") from None
    if not values:
        raise ValueError(f"{option} {text!r} names no value")
    return values


def fail(err: Exception) -> NoReturn:
    """Bad input found past option parsing: its message on stderr (markup-escaped, so a
    bracket in it prints as written) and exit status 2, as the option parser's errors."""
    err_console.print(f"[red]error:[/red] {escape(str(err))}", soft_wrap=True)
    raise typer.Exit(2) from None


def writable(record: bool = True, **outputs: Path | None) -> None:
    """Every output path a command will write, checked before any work (an unwritable one
    exits 2 with its option named: a finished run is never lost to its save). Keys are
    option names with `_` for `-` (`json=...` checks `--json`). A `--json` record also
    needs a clean tree (`bench.record`), unless `record=False` (the file is no record)."""
    from feather_lab.bench.output import check_output_path
    from feather_lab.bench.record import require_clean

    if record and outputs.get("json") is not None:
        try:
            require_clean()
        except ValueError as err:
            fail(err)
    for name, path in outputs.items():
        if path is None:
            continue
        try:
            check_output_path(Path(path), "--" + name.replace("_", "-"))
        except ValueError as err:
            fail(err)


def optional_names(text: str | None, option: str) -> list[str] | None:
    """Names of a comma-separated option; None when not given; an error when given empty."""
    if text is None:
        return None
    found = names([text])
    if not found:
        fail(ValueError(f"{option} {text!r} names nothing; give at least one name"))
    return found


def schedule_fields(opts: dict[str, Any]) -> dict[str, Any]:
    """The `BenchSpec` fields of a workload's schedule and SLO (`--arrival`, `--rate-scale`,
    `--limit`, `--rates`, `--slo-ttft`, `--slo-tpot`), taken the same way by every command
    that builds workloads (`feather bench`, `feather replay`)."""
    rates = opts["rates"]
    return {
        "arrival": opts["arrival"],
        "rate_scale": opts["rate_scale"],
        "limit": opts["limit"],
        "slo": slo_of(opts),
        "rates": None if rates is None else float_list(rates, "--rates"),
    }


def slo_of(opts: dict[str, Any]) -> Any:
    """The `SLO` of `--slo-ttft` and `--slo-tpot`."""
    from feather_lab.sim.result import SLO

    return SLO(opts["slo_ttft"], opts["slo_tpot"])
