"""What a bench prints and writes: rows as they finish, progress, output paths checked first.

Rows go to stdout as plain text, one workload's block as soon as it is done, in columns that
fit the terminal (80 columns when piped: a compact set; wider: more) and never cut a number:
a value wider than its column widens the line instead. Progress and errors go to stderr: a
live bar with an ETA on a terminal, else a plain line per finished run (and one every
`PLAIN_EVERY_S` inside a long run), so a piped run (CI, tee) shows what it is doing. An
output file that already exists is replaced, and stderr says so (`replacing`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from feather_lab.bench.columns import LEGEND as LEGEND
from feather_lab.bench.columns import (
    POLICY_WIDTH,
    Column,
    best_marks,
    columns_for,
    columns_of,
    legend,
)
from feather_lab.bench.rows import (
    CLUSTER,
    Row,
    as_rows,
    baseline_of,
    block_title,
    blocks,
    kind_of,
)

PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "webp", "eps", "ps", "tif", "tiff")
PLAIN_EVERY_S = 15.0
PLAIN_WIDTH = 80
"""A plain progress line's most columns (a long run name is cut in its middle)."""


def terminal_width() -> int:
    """The stdout terminal's columns; 80 when not a terminal (a log, a pipe)."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size((80, 24)).columns
    return 80


def header(cols: Sequence[Column], name_width: int = POLICY_WIDTH, first: str = "policy") -> str:
    """The header line: each header right-aligned over its column, as the cells are."""
    return first.ljust(name_width) + "".join(f" {c.header:>{c.width}}" for c in cols)


def workload_block(
    rows: Sequence[Row | Mapping[str, Any]],
    cols: Sequence[Column],
    name_width: int = POLICY_WIDTH,
) -> list[str]:
    """One block's lines (a workload's, or on a cluster a workload at one replica count):
    a title line, then a line per row, the best marked (`columns.best_marks`)."""
    typed = as_rows(rows)
    if not typed:
        return []
    lines = [block_title(typed)]
    for r, mark in zip(typed, best_marks(typed, cols), strict=True):
        name = r.label + mark
        if len(name) + 1 > name_width:  # a long name gets its own line, numbers stay whole
            lines.append(" " + name)
            name = ""
        cells = "".join(f" {c.text(r.fields.get(c.key)):>{c.width}}" for c in cols)
        lines.append((" " + name).ljust(name_width) + cells)
    return lines


def results_text(
    rows: Sequence[Row | Mapping[str, Any]],
    title: str,
    width: int = 80,
    with_legend: bool = False,
) -> str:
    """The whole table as text (what `feather show` and the cluster bench print; the
    simulator's bench prints it in parts, as blocks finish), the legend of its columns
    between the title and the rows when asked. The name column widens to the longest name
    when the columns leave room for it."""
    typed = as_rows(rows)
    kind, baseline = kind_of(typed), baseline_of(typed)
    headline = sum(c.width + 1 for c in columns_of(kind, baseline, wide=False))
    longest = max((len(r.label) + 2 for r in typed), default=0)
    name_width = min(max(POLICY_WIDTH, longest), max(POLICY_WIDTH, width - headline))
    cols = columns_for(width, kind, baseline, name_width)
    first = "router/policy" if kind == CLUSTER else "policy"
    lines = textwrap.wrap(title, max(width, 40), break_long_words=False, break_on_hyphens=False)
    if with_legend:
        lines += ["", *legend(kind, baseline, min(width, 80), cols).splitlines(), ""]
    lines.append(header(cols, name_width, first))
    for block in blocks(typed):
        lines += workload_block(block, cols, name_width)
    return "\n".join(lines)


def results_legend(rows: Sequence[Row | Mapping[str, Any]], width: int = 80) -> str:
    """The legend of `results_text`'s table for these rows, of the columns it shows."""
    typed = as_rows(rows)
    kind, baseline = kind_of(typed), baseline_of(typed)
    return legend(kind, baseline, width, columns_for(width, kind, baseline))


def replacing(*paths: Path | None) -> None:
    """Say on stderr, before writing, which of these outputs already exist and are replaced."""
    for path in paths:
        if path is not None and path.exists():
            print(f"replacing {path}", file=sys.stderr, flush=True)


def plot_beside(json_out: Path) -> Path:
    """The default plot of a run: the JSON's name with .png (h200.json: h200.png)."""
    return json_out.with_suffix(".png")


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
            return f"{elapsed:,.0f} s"
        left = elapsed / self.done * (self.total - self.done)
        return f"{elapsed:,.0f} s, ETA {left:,.0f} s"

    def run_done(self, label: str) -> None:
        self.done += 1
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=label)
        else:
            self._plain(label, "", force=True)

    def inside(self, label: str, finished: int, total: int) -> None:
        """Inside a run: requests finished of total."""
        if self._progress is not None:
            text = f"{label}: {finished:,}/{total:,} requests"
            self._progress.update(self._task, description=text)
        else:
            self._plain(label, f" {finished:,}/{total:,} req")

    def _plain(self, label: str, detail: str, force: bool = False) -> None:
        """`[done/total] label detail (elapsed, ETA)`, the label cut to fit `PLAIN_WIDTH`."""
        now = time.monotonic()
        if force or now - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = now
            head, tail = f"[{self.done}/{self.total}] ", f"{detail} ({self._eta()})"
            room = max(12, PLAIN_WIDTH - len(head) - len(tail))
            if len(label) > room:
                label = label[: room // 2 - 1] + "..." + label[-(room - room // 2 - 2) :]
            print(head + label + tail, file=sys.stderr, flush=True)


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


def is_bound_row(row: Row | Mapping[str, Any]) -> bool:
    """A limit row (`rows.BOUND_PREFIX`), never the best of a run."""
    return Row.of(row).is_bound
