"""`feather results --engines`: re-make the real-engine headline records on this machine.

Each registered command runs as written, in the interpreter that has its engine; its old
records are kept aside and put back unless it exits 0 having written every record it is
registered for. So a piece that fails keeps every record finished before it, and never
leaves a half-made one. A piece whose engine is
not importable where it would run is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from feather_lab.results.registry import PIECES, EnginePiece, Entry, argv_of, python_for


@dataclass(frozen=True)
class Job:
    """One registered command of a piece and the records it makes."""

    piece: EnginePiece
    command: str
    records: tuple[str, ...]
    minutes: float


def jobs(entries: Sequence[Entry], pieces: Sequence[EnginePiece] = PIECES) -> list[Job]:
    """The engines entries as jobs, one per distinct command, in the order of `pieces`."""
    out: list[Job] = []
    for piece in pieces:
        by_command: dict[str, list[Entry]] = {}
        for e in entries:
            if e.remake == "engines" and e.piece == piece.name and e.command:
                by_command.setdefault(e.command, []).append(e)
        for command, group in by_command.items():
            records = tuple(e.path for e in group)
            out.append(Job(piece, command, records, sum(e.minutes for e in group)))
    return out


def listing(todo: Sequence[Job]) -> str:
    """`--list`: each piece, what it runs, its records and its estimated time."""
    lines = []
    for piece in dict.fromkeys(j.piece for j in todo):
        mine = [j for j in todo if j.piece == piece]
        minutes = sum(j.minutes for j in mine)
        when = f"~{minutes:.0f} min" if minutes < 60 else f"~{minutes / 60:.1f} h"
        lines.append(f"{piece.name:<12} {when:>9}  {piece.about}")
        for j in mine:
            lines.append(f"    ~{j.minutes:.0f} min  {', '.join(j.records)}")
    total = sum(j.minutes for j in todo)
    lines.append(f"in all ~{total / 60:.1f} h on 2 cores (estimates)")
    return "\n".join(lines)


def skip_reason(piece: EnginePiece) -> str | None:
    """Why `piece` cannot run here, or None."""
    python = python_for(piece)
    probe = (
        f"import importlib.util,sys; sys.exit(importlib.util.find_spec({piece.needs!r}) is None)"
    )
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{piece.python_var}={python} does not run: {err}"
    if done.returncode != 0:
        return (
            f"{piece.needs!r} is not importable by {python}; set {piece.python_var} to an "
            f"interpreter that has it"
        )
    return None


def run_job(job: Job, root: Path, log: Path) -> dict:
    """Run one job as registered (so each record names that command); its records are kept
    aside first and put back when it fails or leaves one unwritten."""
    kept = {r: (root / r).read_bytes() if (root / r).is_file() else None for r in job.records}
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    started, wall = time.monotonic(), time.time()
    with log.open("a") as out:
        out.write(f"$ {job.command}\n")
        out.flush()
        argv = argv_of(job.command, python_for(job.piece))
        done = subprocess.run(argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    result = {"piece": job.piece.name, "command": job.command, "records": list(job.records)}
    result["seconds"] = round(time.monotonic() - started, 1)
    unwritten = [
        r for r in job.records if not (root / r).is_file() or (root / r).stat().st_mtime < wall
    ]
    if done.returncode == 0 and not unwritten:
        return {**result, "verdict": "re-made"}
    for record, old in kept.items():
        if old is None:
            (root / record).unlink(missing_ok=True)
        else:
            (root / record).write_bytes(old)
    why = f"exit {done.returncode}" + (
        f"; did not write {', '.join(unwritten)}" if unwritten else ""
    )
    return {**result, "verdict": "failed", "detail": f"{why}; old records kept (log: {log})"}


def _eta(todo: Sequence[Job], done: int, spent: float) -> float:
    """Seconds left: the estimates of the jobs left, scaled by how the finished ones ran
    against theirs."""
    estimated_done = sum(j.minutes for j in todo[:done]) * 60
    scale = spent / estimated_done if done and estimated_done > 0 else 1.0
    return sum(j.minutes for j in todo[done:]) * 60 * scale


def run_engines(
    root: Path,
    todo: Sequence[Job],
    summary: Path,
    skip: Callable[[EnginePiece], str | None] | None = None,
) -> bool:
    """Run every job with a progress bar and ETA; the summary is rewritten after each job.
    True when any job failed (a skipped piece is not a failure: the summary says why)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    results: list[dict] = []
    skip = skip or skip_reason
    reasons = {p: skip(p) for p in dict.fromkeys(j.piece for j in todo)}
    logs = summary.with_name(summary.stem + "-logs")  # each piece's output, kept
    logs.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns) as progress:
        task = progress.add_task("", total=len(todo))
        for i, job in enumerate(todo):
            eta = _eta(todo, i, time.monotonic() - began)
            progress.update(
                task, description=f"{job.piece.name}: {job.records[0]} (ETA {eta / 60:.0f} min)"
            )
            reason = reasons[job.piece]
            if reason:
                result = {"piece": job.piece.name, "records": list(job.records)}
                result.update(verdict="skipped", detail=reason)
            else:
                result = run_job(job, root, logs / f"{job.piece.name}.log")
            results.append(result)
            summary.write_text(json.dumps(results, indent=2) + "\n")
            progress.console.print(f"{result['verdict']:<8} {', '.join(job.records)}")
            if result["verdict"] != "re-made":
                progress.console.print(f"    {result['detail']}")
            progress.advance(task)
    failed = [r for r in results if r["verdict"] == "failed"]
    made = sum(r["verdict"] == "re-made" for r in results)
    print(f"{made} of {len(results)} re-made, {len(failed)} failed; summary in {summary}")
    return bool(failed)
