"""The one writer of benchmark records, and the clean-tree rule every record obeys.

A published number must be re-made from the code that made it, so a record names its
command (argv as run), commit, date (ISO 8601, UTC) and machine, and a record-making command
refuses to start on a tree with uncommitted changes (exit 2, naming them): the commit it
would name could not be checked out. `--allow-dirty` or FEATHER_ALLOW_DIRTY=1 lets it run,
and the record then says `dirty: true`.
"""

from __future__ import annotations

import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

from feather_lab.bench.machine import changed_files, git_commit, machine_info, write_json

ALLOW_VAR = "FEATHER_ALLOW_DIRTY"
ALLOW_FLAG = "--allow-dirty"
_argv: list[str] | None = None  # the command line as run, before ALLOW_FLAG was taken out


class DirtyTree(ValueError):
    """The source tree has uncommitted changes and no one allowed a record made from it."""


def dirty_allowed() -> bool:
    return os.environ.get(ALLOW_VAR, "") == "1"


def take_allow_flag(argv: list[str]) -> None:
    """Take `--allow-dirty` out of `argv` (in place, wherever it stands) so each command's
    own parser never sees it; it sets FEATHER_ALLOW_DIRTY=1. The record keeps the argv as
    it was typed."""
    global _argv
    _argv = list(argv)
    if ALLOW_FLAG in argv:
        argv[:] = [a for a in argv if a != ALLOW_FLAG]
        os.environ[ALLOW_VAR] = "1"


def require_clean() -> None:
    """Raise DirtyTree (a ValueError: commands exit 2 on it) naming the changed files, unless
    the tree is clean or a dirty record was allowed."""
    changed = changed_files()
    if changed and not dirty_allowed():
        more = f" and {len(changed) - 10} more" if len(changed) > 10 else ""
        shown = ", ".join(changed[:10]) + more
        raise DirtyTree(
            f"the source tree has uncommitted changes ({shown}); a record must name a commit "
            f"that holds its code: commit first, or pass {ALLOW_FLAG} (or {ALLOW_VAR}=1) and "
            "the record says dirty: true"
        )


def guard() -> None:
    """For a script that makes records: call first thing, before parsing its arguments.
    Takes `--allow-dirty` out of sys.argv; on a dirty tree not allowed, exits 2."""
    take_allow_flag(sys.argv)
    try:
        require_clean()
    except DirtyTree as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def command_line(argv: list[str] | None = None) -> str:
    """The command as run: `feather ...` for the CLI, `python benchmarks/...` for a script."""
    words = list(argv if argv is not None else (_argv or sys.argv))
    head = words[0] if words else ""
    if Path(head).name == "feather" or Path(head).match("feather_lab/cli/*.py"):
        words[0] = "feather"
    elif head.endswith(".py"):
        path = Path(head)
        if path.is_absolute() and path.is_relative_to(Path.cwd()):
            path = path.relative_to(Path.cwd())
        words[0:1] = ["python", str(path)]
    return shlex.join(words)


def stamp() -> dict[str, object]:
    """How a record was made. Raises DirtyTree where `require_clean` would."""
    require_clean()
    dirty = bool(changed_files())
    commit = git_commit()
    if commit and not dirty:
        commit = commit.removesuffix("+dirty")
    out: dict[str, object] = {
        "command": command_line(),
        "commit": commit,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if dirty:
        out["dirty"] = True
    return out


def write_record(path: str | os.PathLike, **fields: object) -> None:
    """A benchmark's JSON record: the machine it ran on and how it was made, then its fields
    (rows, config). Every record-making path writes through here."""
    write_json(path, {"machine": machine_info(), "provenance": stamp(), **fields})
