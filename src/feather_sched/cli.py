"""The `feather` command."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="Feather: prefix-homogeneity-aware scheduling for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
)
trace_app = typer.Typer(help="Inspect request traces (Mooncake JSONL or Feather JSONL).")
app.add_typer(trace_app, name="trace")
console = Console()


@app.callback()
def _main() -> None:
    """Feather: prefix-homogeneity-aware scheduling for LLM serving."""


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{option} expects comma-separated integers, got {text!r}"
        ) from None
    if any(v < 1 for v in values):
        raise typer.BadParameter(f"{option} values must be >= 1, got {text!r}")
    return values


@app.command("index-bench")
def index_bench(
    queues: str = typer.Option("1000,10000,100000", help="Queue sizes, 2,000-token prompts."),
    long_queues: str = typer.Option(
        "1000,10000", help="Queue sizes for the long-prompt case (20,000-token prompts)."
    ),
    chunk_size: int = typer.Option(64, min=1, help="CHT chunk size in tokens."),
    batch: int = typer.Option(32, min=1, help="Admissions per scheduling decision."),
    repeats: int = typer.Option(5, min=1, help="Timed repetitions per measurement (median)."),
    seed: int = typer.Option(0),
    json_out: Path | None = typer.Option(None, "--json", help="Write rows to this JSON file."),
) -> None:
    """Time prefix detection per scheduling decision: CHT vs radix-tree LPM pass."""
    from feather_sched.bench.index_bench import IndexBenchCase, run_case
    from feather_sched.bench.machine import machine_info

    cases = [IndexBenchCase(q, 2_000, 1_500) for q in _int_list(queues, "--queues")]
    cases += [IndexBenchCase(q, 20_000, 15_000) for q in _int_list(long_queues, "--long-queues")]
    rows = []
    with console.status("index-bench") as status:
        for case in cases:
            row = run_case(
                case,
                chunk_size=chunk_size,
                batch=batch,
                repeats=repeats,
                seed=seed,
                progress=lambda msg: status.update(f"index-bench: {msg}"),
            )
            rows.append(row)
            console.log(
                f"queue {row.queue:>7,} x {row.prompt_tokens:>6,} tok: "
                f"CHT {row.cht_us_per_decision:,.1f} us, radix {row.radix_us_per_decision:,.0f} us"
            )
    table = Table(title=f"Prefix detection cost per decision ({batch} admissions)")
    for col in (
        "queue",
        "prompt tok",
        "CHT us/decision",
        "radix us/decision",
        "speedup",
        "CHT us/insert",
        "radix us/insert",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r.queue:,}",
            f"{r.prompt_tokens:,}",
            f"{r.cht_us_per_decision:,.1f}",
            f"{r.radix_us_per_decision:,.0f}",
            f"{r.decision_speedup:,.0f}x",
            f"{r.cht_us_per_insert:,.1f}",
            f"{r.radix_us_per_insert:,.1f}",
        )
    console.print(table)
    if json_out is not None:
        payload = {"machine": machine_info(), "rows": [r.to_dict() for r in rows]}
        json_out.write_text(json.dumps(payload, indent=2) + "\n")
        console.print(f"wrote {json_out}")


@trace_app.command("stats")
def trace_stats_cmd(
    path: Path = typer.Argument(
        ..., help="Trace file: Mooncake JSONL (hash_ids) or Feather JSONL."
    ),
    limit: int | None = typer.Option(None, min=1, help="Read only the first N requests."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the stats as JSON."),
) -> None:
    """Request count, token totals and the share of prompt tokens that are a shared prefix."""
    from dataclasses import asdict

    from feather_sched.workloads.stats import render_stats, trace_stats
    from feather_sched.workloads.traces import TraceFormatError, read_trace

    if not path.is_file():
        raise typer.BadParameter(f"no such file: {path}", param_hint="PATH")
    try:
        with console.status(f"reading {path.name}"):
            requests = read_trace(path, limit=limit)
        with console.status("computing shared prefixes"):
            stats = trace_stats(requests)
    except TraceFormatError as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    console.print(render_stats(stats, title=f"Trace {path.name}"))
    if json_out is not None:
        json_out.write_text(json.dumps(asdict(stats), indent=2) + "\n")
        console.print(f"wrote {json_out}")


if __name__ == "__main__":
    app()
