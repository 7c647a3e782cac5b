"""Figures quoted in docs, each checked against the record it names.

A figure carries an HTML comment right after it that names its source:

    3.19x<!-- record: benchmarks/replay/incore-kv-pressure-quiet.json ab[0].b_over_a .2f -->

The comment gives the record (a path from the repository root), the JSON path of the value
(dots, `[i]`, `[key=value,...]` for the one row with those fields, `[*]` for every element;
`A / B` divides two values of the same record) and the format spec it is printed with.
`median(E, ...)`, `min(...)`, `max(...)` combine such values (`min(rows[*].ratio)`: over every
row), and a range quoted as `0.97-1.02` is marked `range(E, ...)` (its lowest and highest):

    0.97-1.02<!-- record: r.json range(median(a / b, c / d), median(e / f, g / h)) .2f -->

A long source reads better as a name, `3.19x<!-- figure: replay-kv-pressure -->`, defined in
benchmarks/figures.toml by `record`, `value` and `format`.

The check renders the value with that spec and compares it, digit for digit, with the number
just before the comment; so a figure that drifts from its record, or a record re-made without
its figure, fails by name.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

MARK = re.compile(
    r"<!--\s*(?:record:\s*(?P<path>\S+)\s+(?P<expr>.+?)\s+(?P<spec>\S+)"
    r"|figure:\s*(?P<name>[\w.+-]+))\s*-->"
)
NAMES = Path("benchmarks/figures.toml")
NUMBER = re.compile(r"(?P<num>(?:[\d,]*\.?\d+-)?-?[\d,]*\.?\d+)(?P<unit>[x%]?)\s*$")
CALL = re.compile(r"^(?P<name>median|min|max|range)\((?P<args>.*)\)$")
STEP = re.compile(r"\.?([^.\[\]]+)|\[(-?\d+)\]|\[(\*|[^\]]*=[^\]]*)\]")


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
class DocProblem:
    """A quoted figure or a rendered table that disagrees with its records."""

    doc: str
    line: int
    what: str
    reason: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.what}: {self.reason}"


def mismatch(fig: Figure, reason: str) -> DocProblem:
    return DocProblem(fig.doc, fig.line, f"{fig.quoted!r} ({fig.record} {fig.expr})", reason)


def find_figures(doc: Path, root: Path) -> list[Figure]:
    """Every marked figure in `doc`; a mark with no number before it is itself a figure
    whose quoted text is empty (so the check reports it)."""
    text = doc.read_text(encoding="utf-8")
    names = named(root)
    out = []
    for m in MARK.finditer(text):
        before = NUMBER.search(text[: m.start()])
        quoted = before.group("num") if before else ""
        line = text.count("\n", 0, m.start()) + 1
        name = doc_name(doc, root)
        if m["name"] is None:
            out.append(Figure(name, line, quoted, m["path"], m["expr"], m["spec"]))
        else:
            src = names.get(m["name"], {"record": f"{NAMES} (no figure {m['name']!r})"})
            value, spec = src.get("value", ""), src.get("format", "")
            out.append(Figure(name, line, quoted, src["record"], value, spec))
    return out


def doc_name(doc: Path, root: Path) -> str:
    """`doc` as a report names it: from the repository root where it lies inside it."""
    if doc.resolve().is_relative_to(root.resolve()):
        return str(doc.resolve().relative_to(root.resolve()))
    return str(doc)


def named(root: Path) -> dict[str, dict[str, str]]:
    """The named figures of benchmarks/figures.toml ({} where there is none)."""
    from feather_lab.results.registry import tomllib

    path = root / NAMES
    return tomllib.loads(path.read_text())["figure"] if path.is_file() else {}


def lookup(data: object, path: str) -> object:
    """The value at `path` (`rows[3].ratio`, `config.git_commit`,
    `rows[workload=paper-5g,policy=fcfs].output_tok_s`) in a loaded record; after `[*]` the
    rest of the path is read in every element that has it, giving a list (for min, max,
    median, range)."""
    return _walk(data, STEP.findall(path.strip()))


def _walk(value: object, steps: list[tuple[str, str, str]]) -> object:
    for i, (key, index, where) in enumerate(steps):
        if where == "*":
            return _every(value, steps[i + 1 :])  # type: ignore[arg-type]
        if where:
            value = select(value, where)  # type: ignore[arg-type]
        elif index:
            value = value[int(index)]  # type: ignore[index]
        elif isinstance(value, list) and key.isdigit():
            value = value[int(key)]
        else:
            value = value[key]  # type: ignore[index]
    return value


def _every(items: list, steps: list[tuple[str, str, str]]) -> list:
    """The rest of the path read in every element that has it (rows of one record often differ
    in their fields); none having it is an error."""
    found = []
    for item in items:
        try:
            found.append(_walk(item, steps))
        except (KeyError, IndexError, TypeError):
            continue
    if not found:
        raise KeyError(f"[*]: no element has {''.join(k or i or w for k, i, w in steps)!r}")
    return found


def select(rows: list[dict], where: str) -> dict:
    """The one row of `rows` whose fields equal each `key=value` of `where` (as text), so a
    mark names its row by what it is rather than by its place in the list."""
    pairs = [p.split("=", 1) for p in where.split(",")]
    found = [
        r for r in rows if all(k.strip() in r and str(r[k.strip()]) == v.strip() for k, v in pairs)
    ]
    if len(found) != 1:
        raise KeyError(f"[{where}]: {len(found)} rows match, not 1")
    return found[0]


def _split(args: str) -> list[str]:
    """`args` split at its top-level commas."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(args):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(args[start:i])
            start = i + 1
    return [a.strip() for a in [*out, args[start:]]]


Value = float | tuple[float, float] | list[float]


def evaluate(data: object, expr: str) -> Value:
    """`A`, `A / B` (JSON paths into the same record) or a call of median, min, max or
    range over such expressions; range gives (lowest, highest), and a path through `[*]`
    gives a list, which only a call may take."""
    expr = expr.strip()
    call = CALL.match(expr)
    if call:
        numbers: list[float] = []
        for arg in _split(call["args"]):
            value = evaluate(data, arg)
            if isinstance(value, tuple):
                raise ValueError(f"{expr!r}: a range inside a call")
            numbers.extend(value if isinstance(value, list) else [value])
        numbers.sort()
        if call["name"] == "range":
            return numbers[0], numbers[-1]
        return {"min": numbers[0], "max": numbers[-1]}.get(
            call["name"], float(statistics.median(numbers))
        )
    parts = [p.strip() for p in expr.split(" / ")]
    if len(parts) > 2:
        raise ValueError(f"{expr!r}: at most one ' / '")
    values = [_numbers(lookup(data, p)) for p in parts]
    return values[0] if len(values) == 1 else _quotient(*values)


def _numbers(value: object) -> float | list[float]:
    if isinstance(value, list):
        return [float(v) for v in value]
    return float(value)  # type: ignore[arg-type]


def _quotient(a: float | list[float], b: float | list[float]) -> float | list[float]:
    """a / b, element by element where either is a list."""
    if isinstance(a, list) or isinstance(b, list):
        tops = a if isinstance(a, list) else [a] * len(b)  # type: ignore[arg-type]
        bottoms = b if isinstance(b, list) else [b] * len(tops)
        return [x / y for x, y in zip(tops, bottoms, strict=True)]
    return a / b


def render(value: Value, spec: str) -> str:
    if isinstance(value, list):
        raise ValueError("a list ([*]) outside min, max, median or range")
    if isinstance(value, tuple):
        return f"{format(value[0], spec)}-{format(value[1], spec)}"
    return format(value, spec)


def check_figure(fig: Figure, root: Path) -> DocProblem | None:
    path = root / fig.record
    if not path.is_file():
        return mismatch(fig, f"no record {fig.record}")
    try:
        rendered = render(evaluate(json.loads(path.read_text()), fig.expr), fig.spec)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        return mismatch(fig, f"cannot read {fig.expr!r}: {exc!r}")
    if not fig.quoted:
        return mismatch(fig, "no number right before the mark")
    if rendered != fig.quoted:
        return mismatch(fig, f"the record says {rendered}")
    return None


def check_docs(docs: list[Path], root: Path) -> tuple[int, list[DocProblem]]:
    """(figures checked, mismatches) over `docs`."""
    figures = [f for d in docs for f in find_figures(d, root)]
    bad = [m for f in figures if (m := check_figure(f, root)) is not None]
    return len(figures), bad
