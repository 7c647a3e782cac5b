"""`feather results --check`: figures and tables against records, records' provenance, staleness.

A figure or a rendered table that differs from its records fails, and so does a registry
(benchmarks/records.toml) that misses a record or names one that is gone. A record that does
not name its command, commit, machine and date (nor has a command registered), was made from
a dirty tree, or is older than the code it measures fails too, unless `allow_stale`: then
those are listed and the check passes, while the older records wait to be re-made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from feather_lab.results.blocks import check_tables
from feather_lab.results.figures import DocProblem, check_docs
from feather_lab.results.provenance import read_provenance, records
from feather_lab.results.registry import REGISTRY, Entry, load
from feather_lab.results.staleness import stale_reason, unchanged_commits


@dataclass(frozen=True)
class CheckSpec:
    root: Path
    docs: tuple[Path, ...] = ()
    allow_stale: bool = False


@dataclass
class CheckReport:
    figures: int = 0
    mismatches: list[DocProblem] = field(default_factory=list)
    tables: int = 0
    table_problems: list[DocProblem] = field(default_factory=list)
    registry: list[str] = field(default_factory=list)
    records: int = 0
    incomplete: list[str] = field(default_factory=list)
    dirty: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    def failed(self, spec: CheckSpec) -> bool:
        late = self.incomplete or self.dirty or self.stale
        drift = self.mismatches or self.table_problems or self.registry
        return bool(drift or (late and not spec.allow_stale))


def default_docs(root: Path) -> tuple[Path, ...]:
    """The pages that quote records: the README, docs/ and every page under benchmarks/."""
    pages = sorted((root / "benchmarks").rglob("*.md"))
    return (root / "README.md", *sorted((root / "docs").glob("*.md")), *pages)


def run_check(spec: CheckSpec) -> CheckReport:
    report = CheckReport()
    docs = list(spec.docs or default_docs(spec.root))
    report.figures, report.mismatches = check_docs(docs, spec.root)
    report.tables, report.table_problems = check_tables(docs, spec.root)
    entries = _registered(spec.root, report)
    try:
        unchanged_commits(spec.root)
    except ValueError as err:
        report.registry.append(str(err))
        return report
    for path in records(spec.root):
        prov = read_provenance(path, spec.root)
        if prov is None:
            continue
        report.records += 1
        entry = entries.get(prov.path)
        if entry is None:
            report.registry.append(f"{prov.path}: not in {REGISTRY}")
        missing = [m for m in prov.missing if not (m == "command" and entry and entry.command)]
        if missing:
            report.incomplete.append(f"{prov.path}: names no {', '.join(missing)}")
        if prov.dirty:
            report.dirty.append(f"{prov.path}: made from a dirty tree ({prov.commit})")
        reason = stale_reason(spec.root, prov.path, prov.commit, entry and entry.measures)
        if reason:
            report.stale.append(f"{prov.path}: {reason}")
    return report


def _registered(root: Path, report: CheckReport) -> dict[str, Entry]:
    """Each registered record's entry by path; registry problems go to the report."""
    if not (root / REGISTRY).is_file():
        report.registry.append(f"no {REGISTRY}: every record names its re-making command there")
        return {}
    try:
        entries = load(root)
    except (ValueError, OSError) as err:
        report.registry.append(str(err))
        return {}
    for e in entries:
        if not (root / e.path).is_file():
            report.registry.append(f"{e.path}: registered, but there is no such record")
    return {e.path: e for e in entries}
