"""`feather trace stats`: a trace's request count, token totals and shared-prefix share."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from feather_lab.bench.machine import write_json
from feather_lab.cli.common import (
    console,
    fail,
    trace_app,
    writable,
)
from feather_lab.cli.options import Arrival, Limit, Seed


@trace_app.command("stats")
def trace_stats_cmd(
    path: Annotated[
        Path, typer.Argument(help="Trace file: Mooncake JSONL (hash_ids) or Feather JSONL.")
    ],
    limit: Annotated[
        int | None, typer.Option(min=1, help="Read only the first N requests.")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the stats as JSON.")
    ] = None,
) -> None:
    """Request count, token totals and the share of prompt tokens that are a shared prefix."""
    from feather_lab.workloads.stats import render_stats, trace_stats
    from feather_lab.workloads.traces import TraceFormatError, read_trace

    if path.is_dir():
        fail(ValueError(f"{path} is a directory; give a trace file"))
    if not path.is_file():
        raise typer.BadParameter(f"no such file: {path}", param_hint="PATH")
    writable(record=False, json=json_out)
    try:
        with console.status(f"reading {path.name}"):
            requests = read_trace(path, limit=limit)
        if not requests:
            raise ValueError(f"{path}: the trace holds no request")
        with console.status("computing shared prefixes"):
            stats = trace_stats(requests)
    except (TraceFormatError, ValueError) as err:
        fail(err)
    console.print(render_stats(stats, title=f"Trace {path.name}"))
    if json_out is not None:
        write_json(json_out, asdict(stats))
        console.print(f"wrote {json_out}")


@trace_app.command("write")
def trace_write_cmd(
    workload: Annotated[
        str,
        typer.Argument(help="A `feather bench` workload (`feather list workloads`) or trace:PATH."),
    ],
    out: Annotated[Path, typer.Argument(help="The trace file to write (Feather JSONL).")],
    seed: Seed = 0,
    arrival: Arrival = None,
    limit: Limit = None,
) -> None:
    """A workload as a trace file (Feather JSONL: token ids, arrival, output length) that
    `feather bench -w trace:FILE` replays and `feather trace stats` reads; a Mooncake trace
    (trace:PATH) comes out with its hash ids turned into tokens."""
    from feather_lab.bench.output import check_output_path
    from feather_lab.bench.prepare import build_bench_workload
    from feather_lab.bench.suite import BenchSpec
    from feather_lab.workloads.traces import TraceFormatError, write_jsonl

    spec = BenchSpec(workloads=[workload], seed=seed, arrival=arrival, limit=limit)
    try:
        check_output_path(out, "OUT")
        spec.validate()
        with console.status(f"building {workload}"):
            requests, _ = build_bench_workload(workload, spec)
        if not requests:
            raise ValueError(f"workload {workload!r} has no requests to write")
        write_jsonl(out, requests)
    except (TraceFormatError, ValueError, OSError) as err:
        fail(err)
    console.print(f"wrote {len(requests):,} requests of {workload} to {out}")
