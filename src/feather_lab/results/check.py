"""`feather results --check`: figures against records, records' provenance, staleness.

Figure mismatches always fail. A record that does not name its command, commit, machine and
date, or names a dirty tree, is listed; so is a stale one; each fails the check only when
asked (`strict`, `fail_stale`), so the repository's older records are reported, not hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from feather_lab.results.figures import Mismatch, check_docs
from feather_lab.results.provenance import read_provenance, records
from feather_lab.results.staleness import stale_reason


@dataclass(frozen=True)
class CheckSpec:
    root: Path
    docs: tuple[Path, ...] = ()
    strict: bool = False
    fail_stale: bool = False


@dataclass
class CheckReport:
    figures: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    records: int = 0
    incomplete: list[str] = field(default_factory=list)
    dirty: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    def failed(self, spec: CheckSpec) -> bool:
        return bool(
            self.mismatches
            or (spec.strict and (self.incomplete or self.dirty))
            or (spec.fail_stale and self.stale)
        )


def default_docs(root: Path) -> tuple[Path, ...]:
    return (root / "README.md", *sorted((root / "docs").glob("*.md")))


def run_check(spec: CheckSpec) -> CheckReport:
    report = CheckReport()
    docs = list(spec.docs or default_docs(spec.root))
    report.figures, report.mismatches = check_docs(docs, spec.root)
    for path in records(spec.root):
        prov = read_provenance(path, spec.root)
        if prov is None:
            continue
        report.records += 1
        if prov.missing:
            report.incomplete.append(f"{prov.path}: names no {', '.join(prov.missing)}")
        if prov.dirty:
            report.dirty.append(f"{prov.path}: made from a dirty tree ({prov.commit})")
        reason = stale_reason(spec.root, prov.path, prov.commit)
        if reason:
            report.stale.append(f"{prov.path}: {reason}")
    return report
