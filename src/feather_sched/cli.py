"""The `feather` command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from feather_sched.bench.suite import DEFAULT_POLICIES

app = typer.Typer(
    help="Feather: prefix-homogeneity-aware scheduling for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
)
trace_app = typer.Typer(help="Inspect request traces (Mooncake JSONL or Feather JSONL).")
app.add_typer(trace_app, name="trace")
console = Console(width=None if sys.stdout.isatty() else 150)


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


@app.command("bench")
def bench(
    workload: list[str] = typer.Option(
        None,
        "--workload",
        "-w",
        help="Workload name or trace:PATH; repeat or comma-separate. Default: the built-in suite.",
    ),
    policies: str = typer.Option(
        ",".join(DEFAULT_POLICIES), help="Comma-separated policies to compare."
    ),
    hardware: str = typer.Option("h100", help="Hardware profile name or JSON file."),
    model: str = typer.Option("llama-3-8b", help="Model profile name or JSON file."),
    kernel: str = typer.Option("paged", help="Attention kernel: paged or ideal."),
    seed: int = typer.Option(0, help="Workload seed."),
    max_num_seqs: int = typer.Option(256, min=1, help="Engine max running sequences."),
    max_batched_tokens: int = typer.Option(8192, min=1, help="Engine token budget per step."),
    num_kv_blocks: int | None = typer.Option(
        None, min=1, help="KV cache blocks (default: sized from the hardware memory)."
    ),
    json_out: Path = typer.Option(Path("feather-bench.json"), "--json", help="JSON results."),
    plot: Path = typer.Option(Path("feather-bench.png"), "--plot", help="PNG plot."),
) -> None:
    """Simulate every policy on every workload; print a table, write JSON and a plot."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from feather_sched.bench.machine import machine_info
    from feather_sched.bench.report import plot_results, results_table
    from feather_sched.bench.suite import DEFAULT_WORKLOADS, BenchSpec, run_bench
    from feather_sched.sim.config import EngineConfig

    names = [w.strip() for item in (workload or []) for w in item.split(",") if w.strip()]
    try:
        spec = BenchSpec(
            workloads=names or list(DEFAULT_WORKLOADS),
            policies=[p.strip() for p in policies.split(",") if p.strip()],
            hardware=hardware,
            model=model,
            kernel=kernel,
            seed=seed,
            engine=EngineConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_batched_tokens,
                num_kv_blocks=num_kv_blocks,
            ),
        )
        spec.validate()
        from feather_sched.sim.cost import StepCostModel

        StepCostModel(hardware, model, kernel)  # fail fast on bad profiles
    except ValueError as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    total = len(spec.workloads) * spec.runs_per_workload()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("simulating", total=total)

        def tick(label: str) -> None:
            progress.update(task, advance=1, description=label)

        try:
            rows = run_bench(spec, on_progress=tick)
        except (ValueError, FileNotFoundError) as err:
            progress.stop()
            console.print(f"[red]error:[/red] {err}")
            raise typer.Exit(2) from None
    title = f"feather bench: {hardware} + {model}, {kernel} kernel, seed {seed}"
    console.print(results_table(rows, title))
    payload = {
        "machine": machine_info(),
        "config": {
            "hardware": hardware,
            "model": model,
            "kernel": kernel,
            "seed": seed,
            "engine": {
                "max_num_seqs": max_num_seqs,
                "max_num_batched_tokens": max_batched_tokens,
                "num_kv_blocks": num_kv_blocks,
            },
        },
        "rows": rows,
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(payload, indent=2) + "\n")
    plot_results(rows, plot, title)
    console.print(f"wrote {json_out} and {plot}")


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
