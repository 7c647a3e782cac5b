"""What a record says about how it was made: command, commit, machine and date.

Records from different commands keep these in different places (top level, `config`, a
list of `commands`); this reads them all the same way so the check can name what is missing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

COMMIT = re.compile(r"^[0-9a-f]{7,40}(\+dirty)?$")
FIELDS = ("command", "commit", "machine", "date")


@dataclass(frozen=True)
class Provenance:
    path: str
    command: str | None
    commit: str | None
    machine: bool
    date: str | None
    marked_dirty: bool = False

    @property
    def missing(self) -> tuple[str, ...]:
        have = {
            "command": self.command,
            "commit": self.commit,
            "machine": self.machine,
            "date": self.date,
        }
        return tuple(f for f in FIELDS if not have[f])

    @property
    def dirty(self) -> bool:
        return self.marked_dirty or bool(self.commit and self.commit.endswith("+dirty"))


def _first(record: dict, *keys: str) -> object:
    for scope in (record, record.get("config") or {}, record.get("provenance") or {}):
        if not isinstance(scope, dict):
            continue
        for key in keys:
            if scope.get(key):
                return scope[key]
    return None


def _commit(record: dict) -> str | None:
    value = _first(record, "git_commit", "commit", "code")
    if isinstance(value, dict):
        value = value.get("commit")
    return value if isinstance(value, str) and COMMIT.match(value) else None


def _command(record: dict) -> str | None:
    value = _first(record, "command", "commands")
    if isinstance(value, list):
        value = "; ".join(str(v) for v in value)
    return str(value) if value else None


def read_provenance(path: Path, root: Path) -> Provenance | None:
    """The record's provenance, or None when the file is not a benchmark record (a hardware
    profile, a learned state, a step log)."""
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or ("machine" not in record and "command" not in record):
        return None
    date = _first(record, "date", "recorded", "recorded_at")
    return Provenance(
        str(path.relative_to(root)),
        _command(record),
        _commit(record),
        bool(record.get("machine")),
        str(date) if date else None,
        bool(_first(record, "dirty")),
    )


def records(root: Path) -> list[Path]:
    return sorted((root / "benchmarks").rglob("*.json"))
