"""`feather results --quick`: re-make the simulated records from today's code and compare.

The simulator is deterministic, so a record re-made with the command it names must come out
with the same rows; where it does not, the first differing value is named. Each record is
one piece, run in its own process into a scratch file, as many at once as `jobs` (a piece
whose command reads another piece's record runs after it); the
summary is rewritten after every piece, so a piece that fails or a run that stops keeps what
finished. `refresh` replaces each identical record by its re-made copy (fresh provenance);
`accept` replaces the differing ones too, after a change meant to move them.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from feather_lab.bench.record import ALLOW_VAR, dirty_allowed
from feather_lab.results.registry import argv_of, load

COMPARED = ("rows", "runs", "cells")
TIMED = re.compile(r"(^|_)(us|ns|wall|cpu)(_|$)")
"""Fields timed on the machine that ran the record (its CPU per decision, per request): they
differ from run to run and are left out of the comparison."""


@dataclass(frozen=True)
class Piece:
    record: str
    command: str
    alone: bool = False


def inputs(piece: Piece, todo: list[Piece]) -> set[str]:
    """The records of other pieces that `piece`'s command reads: it runs after them."""
    return {p.record for p in todo if p.record != piece.record and p.record in piece.command}


def pieces(root: Path) -> list[Piece]:
    """Every simulated record registered with a command that re-makes it
    (benchmarks/records.toml, `remake = "quick"`)."""
    return [
        Piece(e.path, e.command, e.alone) for e in load(root) if e.remake == "quick" and e.command
    ]


def argv(command: str, out: Path, record: str = "") -> list[str]:
    """The command with its outputs sent to `out` (the JSON, wherever the command names
    `record` or a placeholder) and no plot."""
    words = shlex.split(command)
    words = [w for i, w in enumerate(words) if w != "--plot" and words[i - 1 : i] != ["--plot"]]
    first = words.index(record) if record in words else -1  # an input after it stays
    for i, w in enumerate(words):
        if w == "--json" and i + 1 < len(words):
            words[i + 1] = str(out)
        if w == "--steps-out" and i + 1 < len(words):
            words[i + 1] = str(out.with_suffix(".steps.jsonl"))
        if w in ("OUT", "OUT.json") or i == first:
            words[i] = str(out)
    if "--json" not in words and str(out) not in words:
        words += ["--json", str(out)]
    return argv_of(shlex.join(words), sys.executable)


def first_difference(old: object, new: object, at: str = "") -> str | None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if TIMED.search(str(key)):
                continue
            if key not in old or key not in new:
                return f"{at}.{key}: only in the {'re-made' if key in new else 'recorded'}"
            diff = first_difference(old[key], new[key], f"{at}.{key}")
            if diff:
                return diff
        return None
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return f"{at}: {len(old)} entries recorded, {len(new)} re-made"
        return next(
            (
                d
                for i, (a, b) in enumerate(zip(old, new, strict=True))
                if (d := first_difference(a, b, f"{at}[{i}]"))
            ),
            None,
        )
    return None if old == new else f"{at}: recorded {old!r}, re-made {new!r}"


def compare(recorded: dict, remade: dict) -> str | None:
    for key in COMPARED:
        if key in recorded:
            return first_difference(recorded[key], remade.get(key), key)
    return "no rows, runs or cells to compare"


def refresh(record: Path, remade: dict, command: str) -> None:
    """Replace an identical record by its re-made copy: today's commit and date, and the
    registered command (the copy was written to a scratch path, nothing else differs)."""
    provenance = remade.get("provenance")
    if isinstance(provenance, dict):
        provenance["command"] = command
    record.write_text(json.dumps(remade, indent=2) + "\n")


@dataclass(frozen=True)
class QuickSpec:
    root: Path
    summary: Path = Path("results-quick.json")
    jobs: int = 1
    refresh: bool = False
    accept: bool = False


def run_piece(piece: Piece, spec: QuickSpec, scratch: Path) -> dict:
    root = spec.root
    out = scratch / Path(piece.record).name
    started = time.monotonic()
    env = {"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"}
    if dirty_allowed():
        env[ALLOW_VAR] = "1"
    done = subprocess.run(
        argv(piece.command, out, piece.record), cwd=root, env=env, capture_output=True, text=True
    )
    result = {
        "record": piece.record,
        "command": piece.command,
        "seconds": round(time.monotonic() - started, 1),
    }
    if done.returncode != 0 or not out.is_file():
        return {**result, "verdict": "failed", "detail": done.stderr.strip()[-400:]}
    remade = json.loads(out.read_text())
    diff = compare(json.loads((root / piece.record).read_text()), remade)
    verdict = "identical" if diff is None else "differs"
    if spec.accept or (spec.refresh and diff is None):
        refresh(root / piece.record, remade, piece.command)
        verdict = verdict if diff is None else "accepted"
    return {**result, "verdict": verdict, "detail": diff}


def _changed_plots(root: Path) -> set[str]:
    from feather_lab.bench.machine import PLOTS

    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return {line[3:] for line in out.splitlines() if line[3:].endswith(PLOTS)}


def _ready(
    waiting: list[Piece], running: dict, done: dict[str, dict], todo: list[Piece]
) -> list[Piece]:
    """The pieces that may start now: their inputs are made; a piece timed on this machine
    starts only once everything else has finished, and runs by itself."""
    ready = [p for p in waiting if not inputs(p, todo) - done.keys()]
    shared = [p for p in ready if not p.alone]
    if shared or any(not p.alone for p in waiting) or running:
        return shared
    return ready[:1]


def _report(
    piece: Piece,
    future: Future,
    done: dict[str, dict],
    todo: list[Piece],
    spec: QuickSpec,
    began: float,
) -> None:
    """Keep a finished piece's result, rewrite the summary and print the progress line."""
    result = future.result()
    done[piece.record] = result
    ordered = [done[p.record] for p in todo if p.record in done]
    spec.summary.write_text(json.dumps(ordered, indent=2) + "\n")
    spent = time.monotonic() - began
    eta = spent / len(done) * (len(todo) - len(done))
    print(
        f"[{len(done)}/{len(todo)}] {result['verdict']:<9} {piece.record} "
        f"({result['seconds']} s; ETA {eta / 60:.1f} min)",
        flush=True,
    )
    if result["detail"]:
        print(f"    {result['detail']}", flush=True)


def run_quick(spec: QuickSpec) -> bool:
    """Re-make every piece, printing progress with an ETA; True when any differs or fails
    (an accepted difference counts as settled)."""
    root = spec.root
    todo = pieces(root)
    plots_before = _changed_plots(root)
    done: dict[str, dict] = {}
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(spec.jobs) as pool:
        waiting, running = list(todo), {}
        while waiting or running:
            for piece in _ready(waiting, running, done, todo):
                waiting.remove(piece)
                running[pool.submit(run_piece, piece, spec, Path(tmp))] = piece
            if not running:
                raise ValueError(f"these pieces read each other's records: {waiting}")
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in finished:
                _report(running.pop(future), future, done, todo, spec, began)
    redrawn = sorted(_changed_plots(root) - plots_before)
    if redrawn:  # a piece that draws beside its record: the tracked plot stays as committed
        subprocess.run(["git", "checkout", "--", *redrawn], cwd=root, check=False)
    bad = [r for r in done.values() if r["verdict"] not in ("identical", "accepted")]
    same = sum(r["verdict"] == "identical" for r in done.values())
    print(
        f"{same} of {len(done)} identical, {len(done) - same - len(bad)} accepted, "
        f"{len(bad)} differing or failed; {time.monotonic() - began:.0f} s; "
        f"summary in {spec.summary}"
    )
    return bool(bad)
