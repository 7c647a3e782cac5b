"""A record is stale when the code it measures changed after it was made.

What each benchmarks/ folder measures is a set of source paths; a record is stale when a
commit that touched them is not in the record's own commit (or, for a record that names no
commit, is newer than the commit that last wrote the record file). A commit that touched
those paths without changing any decision (metrics, docstrings, a split that the simulator
check found identical) is declared in benchmarks/unchanged.toml with its reason, and does
not age a record.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

UNCHANGED = Path("benchmarks/unchanged.toml")

DECISIONS = ("src/feather_sched/policies", "src/feather_sched/host", "src/feather_sched/cost")
MEASURES: dict[str, tuple[str, ...]] = {
    "sim": (*DECISIONS, "src/feather_lab/sim"),
    "feather": (*DECISIONS, "src/feather_lab/sim"),
    "scheduler-cpu": (*DECISIONS, "src/feather_lab/sim", "src/feather_sched/sglang"),
    "cluster": (
        *DECISIONS,
        "src/feather_lab/sim",
        "src/feather_sched/routing",
        "src/feather_sched/ray",
    ),
    "paper-policies": (
        *DECISIONS,
        "src/feather_lab/sim",
        "src/feather_sched/vllm",
        "src/feather_sched/sglang",
    ),
    "vllm": (*DECISIONS, "src/feather_sched/vllm"),
    "replay": (*DECISIONS, "src/feather_sched/vllm"),
    "sglang": (*DECISIONS, "src/feather_sched/sglang"),
    "cht": ("src/feather_sched/index",),
}


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


@cache
def unchanged_commits(root: Path) -> frozenset[str]:
    """The commits declared in benchmarks/unchanged.toml; ValueError naming an entry that is
    not a full commit hash or gives no reason."""
    path = root / UNCHANGED
    if not path.is_file():
        return frozenset()
    found = set()
    for i, raw in enumerate(tomllib.loads(path.read_text(encoding="utf-8")).get("commit", [])):
        commit, why = str(raw.get("id", "")), str(raw.get("why", "")).strip()
        if not re.fullmatch(r"[0-9a-f]{40}", commit) or not why:
            raise ValueError(f"{UNCHANGED} commit {i}: needs `id` (40 hex digits) and `why`")
        found.add(commit)  # one this history lacks (a shallow clone) never shows in its log
    return frozenset(found)


@cache
def last_change(root: Path, paths: tuple[str, ...]) -> str:
    """The newest commit that touched any of `paths` and is not declared unchanged."""
    skip = unchanged_commits(root)
    log = _git(root, "log", "--format=%H", "--", *paths).splitlines()
    return next((c for c in log if c not in skip), "")


@cache
def is_ancestor(root: Path, older: str, newer: str) -> bool:
    done = subprocess.run(
        ["git", "merge-base", "--is-ancestor", older, newer], cwd=root, capture_output=True
    )
    return done.returncode == 0


@cache
def written_at(root: Path) -> dict[str, str]:
    """Each record's last commit that added or changed its content, renames followed back
    (a move between folders is not a re-make), from one `git log` over benchmarks/."""
    log = _git(root, "log", "-M", "--format=@%H", "--name-status", "--", "benchmarks")
    tracking: dict[str, str] = {}  # the name a record had at this point of history -> record
    found: dict[str, str] = {}
    current = set(_git(root, "ls-files", "benchmarks").splitlines())
    tracking = {p: p for p in current}
    commit = ""
    for line in log.splitlines():
        if line.startswith("@"):
            commit = line[1:]
            continue
        fields = line.split("\t")
        if len(fields) == 3 and fields[0].startswith("R"):
            record = tracking.pop(fields[2], None)
            if record is not None:
                tracking[fields[1]] = record
        elif len(fields) == 2 and fields[0] in ("A", "M"):
            record = tracking.get(fields[1])
            if record is not None and record not in found:
                found[record] = commit
    return found


def stale_reason(
    root: Path, record: str, commit: str | None, measures: tuple[str, ...] | None = None
) -> str | None:
    """Why `record` (a path under benchmarks/) is stale, or None when it is current or it
    measures nothing tracked here; `measures` (the registry's) overrides its folder's."""
    parts = Path(record).parts
    paths = measures if measures is not None else MEASURES.get(parts[1]) if len(parts) > 2 else None
    if not paths:
        return None
    change = last_change(root, paths)
    if not change:
        return None
    base = commit.removesuffix("+dirty") if commit else ""
    if base and _git(root, "cat-file", "-t", base) == "commit":
        if is_ancestor(root, change, base):
            return None
        return f"made at {base[:7]}, before {change[:7]} changed {', '.join(paths)}"
    written = written_at(root).get(record)
    if written and is_ancestor(root, change, written):
        return None
    return f"written before {change[:7]} changed {', '.join(paths)}"
