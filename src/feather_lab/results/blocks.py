"""Tables in docs rendered from their records.

A table that quotes records is written as a block whose content a named renderer
(feather_lab.results.tables) makes from those records, each mark on a line of its own (so a
mark quoted inside a sentence is no block):

    <!-- table: sim-suite-h200 -->
    | workload | fcfs | ... |
    <!-- /table -->

`feather results --check` fails where a block differs from its rendering, naming the doc, the
line and the table, so a table cannot drift from the records it quotes; `feather results
--render` rewrites every block from the records, so a re-made record reaches its page in one
command rather than by hand.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from feather_lab.results.figures import DocProblem, doc_name
from feather_lab.results.tables import TABLES, render_table

OPEN = re.compile(r"^<!--\s*table:\s*(?P<name>[\w.+-]+)\s*-->[ \t]*$", re.M)
CLOSE = "<!-- /table -->"
CLOSING = re.compile(r"^<!--\s*/table\s*-->[ \t]*$", re.M)


@dataclass(frozen=True)
class Block:
    """One table block: where it stands and which renderer it names; `start` and `end` are
    the offsets of its content (`end` -1 where no closing mark follows)."""

    doc: str
    path: Path
    line: int
    name: str
    start: int
    end: int


def problem(block: Block, reason: str) -> DocProblem:
    return DocProblem(block.doc, block.line, f"table {block.name!r}", reason)


def find_blocks(doc: Path, root: Path) -> list[Block]:
    """Every table block in `doc`; one that another block or the end of the doc interrupts
    before its closing mark gets `end` -1."""
    text = doc.read_text(encoding="utf-8")
    out = []
    for m in OPEN.finditer(text):
        close = CLOSING.search(text, m.end())
        end = close.start() if close else -1
        after = OPEN.search(text, m.end())
        if after is not None and (end < 0 or after.start() < end):
            end = -1
        line = text.count("\n", 0, m.start()) + 1
        out.append(Block(doc_name(doc, root), doc, line, m["name"], m.end(), end))
    return out


def rendering(block: Block, root: Path) -> str | DocProblem:
    """What the block should hold (its table between two line breaks), or why it cannot be
    made."""
    if block.end < 0:
        return problem(block, f"no {CLOSE} closes it")
    table = TABLES.get(block.name)
    if table is None:
        return problem(block, "no such table (feather_lab.results.tables names them)")
    missing = [p for p in table.records if not (root / p).is_file()]
    if missing:
        return problem(block, f"no record {', '.join(missing)}")
    try:
        return "\n" + render_table(table, root).strip("\n") + "\n"
    except (KeyError, IndexError, TypeError, ValueError, json.JSONDecodeError) as exc:
        return problem(block, f"cannot render: {exc!r}")


def difference(block: Block, have: str, want: str) -> str:
    """The first line where the block's content departs from its rendering."""
    pairs = zip_longest(have.split("\n"), want.split("\n"), fillvalue="")
    for i, (h, w) in enumerate(pairs):
        if h != w:
            return (
                f"line {block.line + i} reads {h!r}, its records give {w!r} "
                "(feather results --render rewrites it)"
            )
    return "differs from its rendering"


def _walk(doc: Path, root: Path) -> tuple[str, list[tuple[Block, str | DocProblem]]]:
    """`doc`'s text and each of its blocks with its rendering (or why it has none)."""
    return doc.read_text(encoding="utf-8"), [
        (b, rendering(b, root)) for b in find_blocks(doc, root)
    ]


def check_tables(docs: list[Path], root: Path) -> tuple[int, list[DocProblem]]:
    """(table blocks checked, problems) over `docs`."""
    count, problems = 0, []
    for doc in docs:
        text, blocks = _walk(doc, root)
        count += len(blocks)
        for block, want in blocks:
            if isinstance(want, DocProblem):
                problems.append(want)
            elif text[block.start : block.end] != want:
                have = text[block.start : block.end]
                problems.append(problem(block, difference(block, have, want)))
    return count, problems


def render_docs(docs: list[Path], root: Path) -> tuple[list[Block], list[DocProblem]]:
    """Rewrite every block of `docs` from its records: (blocks changed, blocks that could not
    be rendered, left as they were)."""
    changed: list[Block] = []
    problems: list[DocProblem] = []
    for doc in docs:
        text, blocks = _walk(doc, root)
        new = text
        for block, want in reversed(blocks):  # from the end: earlier offsets stay valid
            if isinstance(want, DocProblem):
                problems.append(want)
            elif new[block.start : block.end] != want:
                new = new[: block.start] + want + new[block.end :]
                changed.append(block)
        if new != text:
            doc.write_text(new, encoding="utf-8")
    changed.sort(key=lambda b: (b.doc, b.line))
    problems.sort(key=lambda p: (p.doc, p.line))
    return changed, problems
