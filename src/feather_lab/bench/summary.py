"""The bench's closing summary: per workload, what `feather` gained.

Two ratios of output tokens/s, both from the rows as run: feather over the engine's default
order (the baseline row), and feather over the best other deployable policy of the same
workload (references such as the oracle and the limit rows are left out: no deployment can
run them). Above 1, feather was faster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from feather_lab.bench.report import BOUNDS
from feather_lab.bench.rows import Row, as_rows, blocks

FEATHER = "feather"
KEY = "output_tok_s"
NAME_WIDTH = 30
"""The workload column; a longer name keeps its end (a trace's file name)."""


@dataclass(frozen=True)
class Gain:
    """Feather's standing on one workload."""

    workload: str
    vs_baseline: float | None
    """Feather's tok/s over the baseline's (None without a baseline row or value)."""
    best: str | None
    """The fastest other deployable policy (None when feather ran alone)."""
    vs_best: float | None


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top is not None and bottom else None


def _deployable(row: Row) -> bool:
    return not row.is_bound and row.policy not in BOUNDS and row.policy != FEATHER


def gains(rows: Sequence[Row | Mapping[str, Any]], baseline: str = "fcfs") -> list[Gain]:
    """Feather's gain on each workload that ran it, in the rows' order."""
    out = []
    for block in blocks(as_rows(rows)):
        feather = next((r for r in block if r.policy == FEATHER and r.router is None), None)
        if feather is None:
            continue
        mine = feather.value(KEY)
        base = next((r for r in block if r.policy == baseline), None)
        others = [r for r in block if _deployable(r) and r.value(KEY) is not None]
        best = max(others, key=lambda r: r.value(KEY) or 0.0, default=None)
        out.append(
            Gain(
                workload=feather.workload,
                vs_baseline=_ratio(mine, base.value(KEY)) if base is not None else None,
                best=best.policy if best is not None else None,
                vs_best=_ratio(mine, best.value(KEY)) if best is not None else None,
            )
        )
    return out


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else "..." + name[-(width - 3) :]


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summary_text(rows: Sequence[Row | Mapping[str, Any]], baseline: str = "fcfs") -> str:
    """The summary table (under 80 columns); empty when no workload ran feather."""
    found = gains(rows, baseline)
    if not found:
        return ""
    lines = [
        f"summary: feather's output tok/s over {baseline}'s (the engine's default order)",
        "and over the best other deployable policy's",
        f"{'workload':<{NAME_WIDTH}} {'x ' + baseline:>9}  {'best other policy':<20} {'x best':>6}",
    ]
    for g in found:
        best = _short(g.best or "-", 20)
        lines.append(
            f"{_short(g.workload, NAME_WIDTH):<{NAME_WIDTH}} {_x(g.vs_baseline):>9}  "
            f"{best:<20} {_x(g.vs_best):>6}"
        )
    return "\n".join(lines)
