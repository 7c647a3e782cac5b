"""A record of the machine a benchmark ran on, stored next to its numbers."""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine_info() -> dict:
    import numpy

    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": numpy.__version__,
    }


def _path_as_text(value: object) -> str:
    """JSON for the one non-JSON value a spec carries, a file path; anything else is a bug."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_json(path: str | os.PathLike, payload: object) -> None:
    """Every JSON file the package writes: indented, newline-terminated, its folder made, so
    records from different commands read and diff alike."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=_path_as_text) + "\n")


def package_version() -> str:
    from feather_sched import __version__

    return __version__


def _git(*args: str) -> str | None:
    """`git ARGS` run in the tree this package comes from; None outside git."""
    src = Path(__file__).resolve().parent
    try:
        return subprocess.run(
            ["git", "-C", str(src), *args], capture_output=True, text=True, timeout=5, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


PLOTS = (".png", ".svg")


@functools.cache
def changed_files() -> tuple[str, ...]:
    """Tracked files with uncommitted changes in the tree this package runs from, records
    registered in benchmarks/records.toml and plots left out: neither is code, and
    `feather results` re-makes one after another before they are committed."""
    out = _git("status", "--porcelain", "--untracked-files=no") or ""
    changed = [line[3:] for line in out.splitlines() if line.strip()]
    top = (_git("rev-parse", "--show-toplevel") or "").strip()
    registry = Path(top, "benchmarks", "records.toml") if top else None
    records: set[str] = set()
    if registry is not None and registry.is_file():
        records = set(re.findall(r'^path = "([^"]+)"', registry.read_text(), flags=re.M))
    return tuple(f for f in changed if f not in records and not f.endswith(PLOTS))


@functools.cache
def git_commit() -> str | None:
    """The source tree's git commit (with `+dirty` when it has changes), or None."""
    head = (_git("rev-parse", "HEAD") or "").strip()
    return head + ("+dirty" if changed_files() else "") if head else None


def config_provenance() -> dict[str, Any]:
    """What produced a record: the package version and its git commit (None outside git)."""
    return {"feather_version": package_version(), "git_commit": git_commit()}
