"""`feather index-bench`: prefix detection cost per decision, CHT against a radix tree."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from feather_lab.bench.record import write_record
from feather_lab.cli.common import (
    app,
    console,
    int_list,
    writable,
)
from feather_lab.cli.options import Seed


@app.command("index-bench")
def index_bench(
    queues: Annotated[
        str, typer.Option(help="Queue sizes, 2,000-token prompts.")
    ] = "1000,10000,100000",
    long_queues: Annotated[
        str, typer.Option(help="Queue sizes for the long-prompt case (20,000-token prompts).")
    ] = "1000,10000",
    xl_queues: Annotated[
        str,
        typer.Option(help="Queue sizes for the 128,000-token case (RAG / agent contexts)."),
    ] = "1000",
    chunk_size: Annotated[
        str,
        typer.Option(
            help="CHT chunk sizes in tokens, comma-separated (16 = one vLLM GPU KV block)."
        ),
    ] = "16,64,512",
    batch: Annotated[int, typer.Option(min=1, help="Admissions per scheduling decision.")] = 32,
    repeats: Annotated[
        int, typer.Option(min=1, help="Timed repetitions per measurement (median).")
    ] = 5,
    seed: Seed = 0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write rows to this JSON file.")
    ] = None,
    clock: Annotated[
        str,
        typer.Option(
            help="wall (elapsed) or cpu (process CPU time: fairer on a machine shared with "
            "other work, where long radix passes are descheduled more than short decisions)."
        ),
    ] = "wall",
) -> None:
    """Time prefix detection per scheduling decision: CHT vs radix-tree LPM pass."""
    if clock not in ("wall", "cpu"):
        raise typer.BadParameter(f"--clock must be wall or cpu, got {clock!r}")
    writable(json=json_out)
    from feather_lab.bench.index_bench import IndexBenchCase

    chunks = int_list(chunk_size, "--chunk-size")
    cases = [IndexBenchCase(q, 2_000, 1_500) for q in int_list(queues, "--queues")]
    cases += [IndexBenchCase(q, 20_000, 15_000) for q in int_list(long_queues, "--long-queues")]
    cases += [IndexBenchCase(q, 128_000, 96_000) for q in int_list(xl_queues, "--xl-queues")]
    rows = _run(cases, chunks, batch, repeats, seed, clock)
    rows.sort(key=lambda r: (r.chunk_size, r.prompt_tokens, r.queue))
    console.print(_index_table(rows, batch))
    if json_out is not None:
        write_record(json_out, clock=clock, rows=[r.to_dict() for r in rows])
        console.print(f"wrote {json_out}")


def _run(cases, chunks, batch, repeats, seed, clock) -> list[Any]:
    """Every case, a log line per row as it is measured."""
    from feather_lab.bench.index_bench import IndexBenchRow, run_cases

    rows: list[IndexBenchRow] = []
    with console.status("index-bench") as status:
        for case in cases:
            case_rows = run_cases(
                case,
                chunk_sizes=chunks,
                batch=batch,
                repeats=repeats,
                seed=seed,
                progress=lambda msg: status.update(f"index-bench: {msg}"),
                clock=clock,
            )
            rows += case_rows
            for row in case_rows:
                console.log(
                    f"queue {row.queue:>7,} x {row.prompt_tokens:>7,} tok, chunk "
                    f"{row.chunk_size:>3}: CHT {row.cht_us_per_decision:,.1f} us, radix "
                    f"{row.radix_us_per_decision:,.0f} us, {row.bytes_per_request:,.0f} B/request"
                )
    return rows


def _index_table(rows: Sequence[Any], batch: int) -> Table:
    """Per queue: cost per decision of each index, the speedup, and the insert costs."""
    from feather_lab.bench.index_bench import INDEX_COLUMNS, index_cells

    table = Table(title=f"Prefix detection cost per decision ({batch} admissions)")
    for col in ("chunk", *INDEX_COLUMNS):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r.chunk_size), *index_cells(r.to_dict()))
    return table
