"""What a bench prints and writes: rows as they finish, progress, output paths checked first.

Rows go to stdout as plain text, one workload's block as soon as it is done, in columns that
fit the terminal (80 columns: a compact set; wider: more) and never cut a number: a value
wider than its column widens the line instead. Progress and errors go to stderr: a live bar
with an ETA on a terminal, else a plain line per finished run (and one every `PLAIN_EVERY_S`
inside a long run), so a piped run (CI, tee) shows what it is doing.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "webp", "eps", "ps", "tif", "tiff")
PLAIN_EVERY_S = 15.0


def _secs(v: float) -> str:
    if v < 10:
        return f"{v:.2f}"
    if v < 1000:
        return f"{v:.1f}"
    return f"{v:,.0f}"


def _num(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


# key, header, width, formatter; compact first, then the wide-only ones.
COLUMNS: tuple[tuple[str, str, int, Any], ...] = (
    ("output_tok_s", "tok/s", 8, _num),
    ("vs_fcfs", "xfcfs", 5, lambda v: f"{v:.2f}"),
    ("mean_batch", "batch", 5, lambda v: f"{v:.1f}"),
    ("mean_prefix_groups", "grps", 5, lambda v: f"{v:.1f}"),
    ("ttft_p50_s", "ttft50", 6, _secs),
    ("ttft_p99_s", "ttft99", 6, _secs),
    ("tpot_p99_s", "tpot99", 6, _secs),
    ("latency_p99_s", "e2e99", 6, _secs),
    ("goodput_req_s", "good/s", 6, _num),
)
WIDE_COLUMNS: tuple[tuple[str, str, int, Any], ...] = (
    ("latency_p50_s", "e2e50", 6, _secs),
    ("sched_us_per_step", "sched us", 8, lambda v: f"{v:,.1f}"),
    ("preemptions", "preempt", 7, lambda v: f"{v:,d}"),
)
LEGEND = (
    "tok/s: output tokens/s (higher is better); xfcfs: vs fcfs; batch: mean batch;\n"
    "grps: prefix groups per batch; ttft/tpot/e2e 50/99: time to first token, per\n"
    "output token, end to end, percentile, seconds; good/s: requests/s meeting the\n"
    "SLO (every request without one); * best tok/s. All fields: JSON, `feather show`."
)
POLICY_WIDTH = 18


def terminal_width() -> int:
    """The stdout terminal's columns; 80 when not a terminal (a log, a pipe)."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size((80, 24)).columns
    return 80


def columns_for(width: int) -> tuple[tuple[str, str, int, Any], ...]:
    """The compact set, plus the wide-only columns that still fit `width`."""
    cols = list(COLUMNS)
    used = POLICY_WIDTH + sum(c[2] + 1 for c in cols)
    for col in WIDE_COLUMNS:
        if used + col[2] + 1 <= width:
            cols.append(col)
            used += col[2] + 1
    return tuple(cols)


def header(cols: Sequence[tuple[str, str, int, Any]]) -> str:
    return "policy".ljust(POLICY_WIDTH) + "".join(f" {h:>{w}}" for _, h, w, _ in cols)


def _cell(row: dict, key: str, width: int, fmt: Any) -> str:
    value = row.get(key)
    text = "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt(value)
    return f" {text:>{width}}"


def workload_block(rows: Sequence[dict], cols: Sequence[tuple[str, str, int, Any]]) -> list[str]:
    """One workload's lines: a title line, then a line per policy (best tok/s marked *)."""
    if not rows:
        return []
    first = rows[0]
    extra = f", {first['requests']:,} requests" if "requests" in first else ""
    dropped = first.get("dropped_overlong") or 0
    extra += f", {dropped:,} dropped as overlong" if dropped else ""
    lines = [f"{first['workload']}{extra}"]
    best = max(r["output_tok_s"] for r in rows if not is_bound_row(r))
    for r in rows:
        name = r["policy"] + (f" (cap {r['oracle_cap']})" if "oracle_cap" in r else "")
        name += "*" if r["output_tok_s"] == best and not is_bound_row(r) else ""
        if len(name) + 1 > POLICY_WIDTH:  # a long name gets its own line, numbers stay whole
            lines.append(" " + name)
            name = ""
        lines.append(
            (" " + name).ljust(POLICY_WIDTH) + "".join(_cell(r, k, w, f) for k, _, w, f in cols)
        )
    return lines


def results_text(rows: Sequence[dict], title: str, width: int = 80) -> str:
    """The whole table as text (what `feather show` prints; the bench prints it in parts)."""
    cols = columns_for(width)
    lines = [title, header(cols)]
    for wname in dict.fromkeys(r["workload"] for r in rows):
        lines += workload_block([r for r in rows if r["workload"] == wname], cols)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- progress


class BenchProgress:
    """Progress on stderr: rich's live bar (with ETA) on a terminal, plain lines otherwise.
    Rows printed through `emit` go to stdout without breaking the bar."""

    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self.done = 0
        self.start = time.monotonic()
        self._last_plain = 0.0
        self._live = sys.stderr.isatty()
        self._progress = None
        if self._live:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                "ETA",
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._task = self._progress.add_task("simulating", total=self.total)

    def __enter__(self) -> BenchProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def emit(self, line: str) -> None:
        """A line of results, to stdout."""
        if self._progress is not None and sys.stdout.isatty():
            from rich.text import Text  # a Text is never read as markup (nor is the bar)

            self._progress.console.print(Text(line), highlight=False, soft_wrap=True)
        else:
            print(line, flush=True)

    def _eta(self) -> str:
        elapsed = time.monotonic() - self.start
        if self.done == 0:
            return f"{elapsed:,.0f} s elapsed"
        left = elapsed / self.done * (self.total - self.done)
        return f"{elapsed:,.0f} s elapsed, ETA {left:,.0f} s"

    def run_done(self, label: str) -> None:
        self.done += 1
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=label)
        else:
            self._plain(f"[{self.done}/{self.total}] {label} ({self._eta()})", force=True)

    def inside(self, label: str, finished: int, total: int) -> None:
        """Inside a run: requests finished of total."""
        text = f"{label}: {finished:,}/{total:,} requests"
        if self._progress is not None:
            self._progress.update(self._task, description=text)
        else:
            self._plain(f"[{self.done}/{self.total}] {text} ({self._eta()})")

    def _plain(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = now
            print(text, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- output paths


def check_output_path(path: Path, option: str) -> None:
    """Refuse, before any run, an output path that cannot be written: a directory, a file
    without write permission, or a folder that cannot be created or written in."""
    if path.is_dir():
        raise ValueError(f"{option} {path}: is a directory; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{option} {path}: file is not writable")
    parent = path.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: cannot write in {parent}")
    try:  # permissions do not say it all (root, read-only or virtual file systems): try
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        raise ValueError(f"{option} {path}: cannot write in {parent} ({err.strerror})") from None


def check_plot_path(path: Path) -> None:
    check_output_path(path, "--plot")
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise ValueError(
            f"--plot {path}: give a file name ending in .png (or {', '.join(PLOT_FORMATS[1:4])})"
            + (f"; {suffix!r} is not an image format" if suffix else "")
        )


BOUND_PREFIX = "bound:"
"""Rows named `bound:...` are limits (e.g. `bound:unbounded-kv`, the engine's order with KV
capacity unbounded), not policies: never the best of a run."""


def is_bound_row(row: dict) -> bool:
    return str(row.get("policy", "")).startswith(BOUND_PREFIX)
