"""benchmarks/records.toml: every record, the command that re-makes it and how it is re-made.

`remake` is `quick` (simulated: `feather results --quick` re-makes and compares it),
`engines` (a real-engine headline: `feather results --engines` re-makes it in its `piece`)
or `by-hand` (run `command` as written). The pieces of `--engines` are fixed here, with the
interpreter each needs and the module that must be importable there.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REGISTRY = Path("benchmarks/records.toml")
REMAKES = ("quick", "engines", "by-hand")


@dataclass(frozen=True)
class Entry:
    path: str
    remake: str
    command: str | None = None
    piece: str | None = None
    minutes: float = 0.0
    alone: bool = False
    """A record of this machine's timings (CPU per decision, simulator speed): `--quick` runs
    it with nothing else running, after the rest."""
    measures: tuple[str, ...] | None = None
    """The source paths its figures depend on, where not its folder's (staleness.MEASURES):
    a calibration of an engine's step cost measures the engine and its fitter, not
    Feather's decisions, so a policy change does not age it."""


@dataclass(frozen=True)
class EnginePiece:
    """One part of `--engines`: an engine, the interpreter that has it and what it re-makes."""

    name: str
    about: str
    python_var: str  # the variable naming the interpreter with the engine installed
    needs: str  # a module that interpreter must find, or the piece is skipped


PIECES = (
    EnginePiece(
        "vllm", "vLLM CPU in process (feather bench --engine vllm)", "FEATHER_VLLM_PYTHON", "vllm"
    ),
    EnginePiece(
        "replay", "A/B on two live vLLM CPU servers (feather replay)", "FEATHER_VLLM_PYTHON", "vllm"
    ),
    EnginePiece(
        "sglang-loop",
        "SGLang's own Scheduler loop (feather bench --engine sglang)",
        "FEATHER_SGLANG_PYTHON",
        "sglang",
    ),
    EnginePiece("ray", "Ray Serve over two vLLM CPU replicas", "FEATHER_RAY_PYTHON", "ray"),
)


def load(root: Path) -> list[Entry]:
    """The registry's entries; ValueError naming the entry when one is malformed."""
    data = tomllib.loads((root / REGISTRY).read_text(encoding="utf-8"))
    out = []
    names = {p.name for p in PIECES}
    for i, raw in enumerate(data.get("record", [])):
        try:
            measures = raw.get("measures")
            entry = Entry(**{**raw, "measures": None if measures is None else tuple(measures)})
        except TypeError as err:
            raise ValueError(f"{REGISTRY} record {i}: {err}") from None
        if entry.remake not in REMAKES:
            raise ValueError(
                f"{REGISTRY} record {i} ({entry.path}): remake {entry.remake!r}; valid: {REMAKES}"
            )
        if entry.remake == "engines" and (entry.piece not in names or not entry.command):
            raise ValueError(
                f"{REGISTRY} record {i} ({entry.path}): an engines record needs a command "
                f"and a piece of {sorted(names)}"
            )
        out.append(entry)
    return out


def python_for(piece: EnginePiece) -> str:
    return os.environ.get(piece.python_var) or sys.executable


def argv_of(command: str, python: str) -> list[str]:
    """A registered command as an argv for `python`: `feather ...` runs the CLI module,
    `python x.py ...` the script."""
    words = shlex.split(command)
    if words[0] == "feather":
        return [python, "-m", "feather_lab.cli", *words[1:]]
    if words[0] in ("python", "python3"):
        return [python, *words[1:]]
    raise ValueError(f"{command!r}: a registered command starts with `feather` or `python`")
