"""Figures quoted in docs, each checked against the record it names.

A figure carries an HTML comment right after it that names its source:

    2.84x<!-- record: benchmarks/replay/kv-pressure.json ab.kv-pressure.ratio .2f -->

The comment gives the record (a path from the repository root), the JSON path of the value
(dots and `[i]`; `A / B` divides two values of the same record) and the format spec it is
printed with. The check renders the value with that spec and compares it, digit for digit,
with the number just before the comment; so a figure that drifts from its record, or a
record re-made without its figure, fails by name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

MARK = re.compile(r"<!--\s*record:\s*(?P<path>\S+)\s+(?P<expr>.+?)\s+(?P<spec>\S+)\s*-->")
NUMBER = re.compile(r"(?P<num>-?[\d,]*\.?\d+)(?P<unit>[x%]?)\s*$")
STEP = re.compile(r"\.?([^.\[\]]+)|\[(-?\d+)\]")


@dataclass(frozen=True)
class Figure:
    """One quoted figure: where it stands, what it says and where it claims to come from."""

    doc: str
    line: int
    quoted: str
    record: str
    expr: str
    spec: str


@dataclass(frozen=True)
class Mismatch:
    figure: Figure
    reason: str

    def __str__(self) -> str:
        f = self.figure
        return f"{f.doc}:{f.line}: {f.quoted!r} ({f.record} {f.expr}): {self.reason}"


def find_figures(doc: Path, root: Path) -> list[Figure]:
    """Every marked figure in `doc`; a mark with no number before it is itself a figure
    whose quoted text is empty (so the check reports it)."""
    text = doc.read_text(encoding="utf-8")
    out = []
    for m in MARK.finditer(text):
        before = NUMBER.search(text[: m.start()])
        quoted = before.group("num") if before else ""
        line = text.count("\n", 0, m.start()) + 1
        name = (
            str(doc.resolve().relative_to(root.resolve()))
            if doc.resolve().is_relative_to(root.resolve())
            else str(doc)
        )
        out.append(Figure(name, line, quoted, m["path"], m["expr"], m["spec"]))
    return out


def lookup(data: object, path: str) -> object:
    """The value at `path` (`rows[3].ratio`, `config.git_commit`) in a loaded record."""
    value = data
    for key, index in STEP.findall(path.strip()):
        if index:
            value = value[int(index)]  # type: ignore[index]
        elif isinstance(value, list) and key.isdigit():
            value = value[int(key)]
        else:
            value = value[key]  # type: ignore[index]
    return value


def evaluate(data: object, expr: str) -> float:
    """`A` or `A / B`, each a JSON path into the same record."""
    parts = [p.strip() for p in expr.split(" / ")]
    if len(parts) > 2:
        raise ValueError(f"{expr!r}: at most one ' / '")
    value = float(lookup(data, parts[0]))  # type: ignore[arg-type]
    if len(parts) == 2:
        value /= float(lookup(data, parts[1]))  # type: ignore[arg-type]
    return value


def check_figure(fig: Figure, root: Path) -> Mismatch | None:
    path = root / fig.record
    if not path.is_file():
        return Mismatch(fig, f"no record {fig.record}")
    try:
        value = evaluate(json.loads(path.read_text()), fig.expr)
        rendered = format(value, fig.spec)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        return Mismatch(fig, f"cannot read {fig.expr!r}: {exc!r}")
    if not fig.quoted:
        return Mismatch(fig, "no number right before the mark")
    if rendered != fig.quoted:
        return Mismatch(fig, f"the record says {rendered}")
    return None


def check_docs(docs: list[Path], root: Path) -> tuple[int, list[Mismatch]]:
    """(figures checked, mismatches) over `docs`."""
    figures = [f for d in docs for f in find_figures(d, root)]
    bad = [m for f in figures if (m := check_figure(f, root)) is not None]
    return len(figures), bad
