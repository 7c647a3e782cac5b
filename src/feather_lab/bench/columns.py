"""The columns of `feather bench` results, declared once.

`COLUMNS` says, for every field a table shows, its header, what it means, the unit it is
printed in, how it is printed, which direction is better and whether it decides the best
row. The bench's live table, `feather show` (table, Markdown), `feather compare`, the plots
and the cluster bench all read it, so a new metric is one line here (and the field in the
row that produces it). The JSON keeps each field in the unit its name says (`_s`: seconds);
a column may print it scaled (`tpot99` in milliseconds).

The best row: the `best` column's value as printed (so rows that differ only beyond the
printed digits tie), over the rows that are not bounds. One row at the top gets `*`;
several rows tied at the top get `=`; nothing is marked when every row ties.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from feather_lab.bench.rows import CLUSTER, ENGINE, Kind, Row

BEST_MARK = "*"
TIE_MARK = "="
POLICY_WIDTH = 18
"""The name column of the live table (a longer name gets its own line)."""


@dataclass(frozen=True)
class Column:
    key: str
    """The row field; `{baseline}` in it (and in header, description) is the record's
    baseline (`rows.baseline_of`)."""
    header: str
    description: str
    """A few words for the legend, the plots' axes and `feather compare`."""
    unit: str = ""
    """The unit the value is printed in (after `scale`)."""
    scale: float = 1.0
    """Printed value = field value x scale (the JSON keeps the field's own unit)."""
    format: str = "auto"
    """A format spec (".2f", ",d"), or "auto" (2 decimals below 10, 1 below 100, none
    above) or "secs" (as auto, with 1 decimal up to 1,000)."""
    better: Literal["higher", "lower"] | None = None
    best: bool = False
    """The best row (`*`) is judged on this column."""
    width: int = 6
    kinds: tuple[Kind, ...] = (ENGINE, CLUSTER)
    wide: bool = False
    """Only in a table wider than 80 columns, and not among the headline fields."""
    plot: bool = False
    """A panel of `report.plot_results`."""

    def resolved(self, baseline: str) -> Column:
        """The column with `{baseline}` filled in (as wide as its header)."""
        if "{baseline}" not in self.key:
            return self
        header = self.header.format(baseline=baseline)
        return replace(
            self,
            key=self.key.format(baseline=baseline),
            header=header,
            description=self.description.format(baseline=baseline),
            width=max(self.width, len(header)),
        )

    def text(self, value: Any) -> str:
        """The value as a table prints it; "-" for a missing one."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            return "-"
        v = value * self.scale if self.scale != 1.0 else value
        if self.format == "auto":
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
        if self.format == "secs":
            return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:,.0f}"
        if self.format.endswith("d") and isinstance(v, float):
            return f"{v:{self.format[:-1]}.0f}"  # a median of counts: printed as a count
        return f"{v:{self.format}}"

    def shown(self, value: Any) -> float | None:
        """The value as printed, back as a number: what ties are judged on."""
        text = self.text(value)
        return None if text == "-" else float(text.replace(",", ""))

    @property
    def title(self) -> str:
        """The header with its unit, where no legend is at hand (Markdown, compare)."""
        return f"{self.header} ({self.unit})" if self.unit else self.header


_ONE_ENGINE: tuple[Kind, ...] = (ENGINE,)
_CLUSTER: tuple[Kind, ...] = (CLUSTER,)

# The headline columns of each kind in table order, then the wide-only ones.
COLUMNS: tuple[Column, ...] = (
    Column(
        "output_tok_s", "tok/s", "output tokens/s", better="higher", best=True, width=8, plot=True
    ),
    Column(
        "vs_fcfs",
        "xfcfs",
        "tok/s over fcfs's",
        format=".2f",
        better="higher",
        width=5,
        kinds=_ONE_ENGINE,
        plot=True,
    ),
    Column(
        "vs_{baseline}",
        "x{baseline}",
        "tok/s over {baseline}'s",
        format=".2f",
        better="higher",
        width=5,
        kinds=_CLUSTER,
        plot=True,
    ),
    Column("mean_batch", "batch", "mean batch", format=".1f", width=5),
    Column("mean_prefix_groups", "grps", "prefix groups per batch", format=".1f", width=5),
    Column("ttft_p50_s", "ttft50", "time to first token p50", "s", format="secs", better="lower"),
    Column(
        "ttft_p99_s",
        "ttft99",
        "time to first token p99",
        "s",
        format="secs",
        better="lower",
        plot=True,
    ),
    Column(
        "tpot_p99_s",
        "tpot99",
        "time per output token p99",
        "ms",
        scale=1e3,
        better="lower",
        kinds=_ONE_ENGINE,
    ),
    Column(
        "latency_p99_s",
        "e2e99",
        "end-to-end latency p99",
        "s",
        format="secs",
        better="lower",
        kinds=_ONE_ENGINE,
    ),
    Column(
        "goodput_req_s",
        "good/s",
        "requests/s meeting the SLO (all without one)",
        better="higher",
        kinds=_ONE_ENGINE,
    ),
    Column(
        "load_imbalance",
        "imbal",
        "max over mean requests per replica",
        format=".2f",
        better="lower",
        width=5,
        kinds=_CLUSTER,
    ),
    Column(
        "prefix_hit_rate",
        "hit",
        "prefix cache hit rate",
        format=".2f",
        better="higher",
        width=5,
        kinds=_CLUSTER,
    ),
    Column(
        "latency_p50_s",
        "e2e50",
        "end-to-end latency p50",
        "s",
        format="secs",
        better="lower",
        kinds=_ONE_ENGINE,
        wide=True,
    ),
    Column(
        "sched_us_per_step",
        "sched us",
        "scheduler CPU per step",
        "us",
        format=",.1f",
        better="lower",
        width=8,
        kinds=_ONE_ENGINE,
        wide=True,
    ),
    Column(
        "sched_cpu_share",
        "cpu%",
        "scheduler CPU charged over step time (--scheduler-cpu)",
        "%",
        scale=100,
        format=".1f",
        better="lower",
        width=5,
        kinds=_ONE_ENGINE,
        wide=True,
    ),
    Column("preemptions", "preempt", "preemptions", format=",d", width=7, wide=True),
    Column(
        "router_us_per_request",
        "route us",
        "router CPU per request",
        "us",
        format=",.1f",
        better="lower",
        width=8,
        kinds=_CLUSTER,
        wide=True,
    ),
)


def column(key: str) -> Column:
    """The column of a row field (KeyError for a field no table shows)."""
    found = next((c for c in COLUMNS if c.key == key), None)
    if found is None:
        raise KeyError(f"no column declared for {key!r}")
    return found


def columns_of(kind: Kind, baseline: str = "fcfs", wide: bool = True) -> tuple[Column, ...]:
    """A kind's columns in table order (`wide=False`: the headline ones only)."""
    return tuple(c.resolved(baseline) for c in COLUMNS if kind in c.kinds and (wide or not c.wide))


def columns_for(
    width: int,
    kind: Kind = ENGINE,
    baseline: str = "fcfs",
    name_width: int = POLICY_WIDTH,
) -> tuple[Column, ...]:
    """The headline columns, plus the wide-only ones that still fit `width`."""
    cols = list(columns_of(kind, baseline, wide=False))
    used = name_width + sum(c.width + 1 for c in cols)
    for col in columns_of(kind, baseline):
        if col.wide and used + col.width + 1 <= width:
            cols.append(col)
            used += col.width + 1
    return tuple(cols)


def best_marks(rows: Sequence[Row], cols: Sequence[Column]) -> list[str]:
    """Each row's mark ("", `BEST_MARK` or `TIE_MARK`) on the `best` column among `cols`,
    compared as printed; bounds and rows without the value are never marked."""
    col = next((c for c in cols if c.best), None)
    marks = [""] * len(rows)
    if col is None:
        return marks
    sign = -1.0 if col.better == "lower" else 1.0
    shown = {
        i: sign * v
        for i, r in enumerate(rows)
        if not r.is_bound and (v := col.shown(r.value(col.key))) is not None
    }
    if not shown:
        return marks
    top = max(shown.values())
    winners = [i for i, v in shown.items() if v == top]
    if len(winners) == len(shown) and len(shown) > 1:
        return marks  # every row ties: no row is better than another
    for i in winners:
        marks[i] = BEST_MARK if len(winners) == 1 else TIE_MARK
    return marks


def legend(
    kind: Kind = ENGINE,
    baseline: str = "fcfs",
    width: int = 80,
    shown: Sequence[Column] | None = None,
) -> str:
    """What the table's headers mean, which way is better, and the best-row marks; of the
    `shown` columns when given (the table's), else of every column of the kind."""
    cols = list(shown) if shown is not None else columns_of(kind, baseline)
    parts = [f"{c.header}: {c.description}" + (f", {c.unit}" if c.unit else "") for c in cols]
    higher = [c.header for c in cols if c.better == "higher"]
    lower = [c.header for c in cols if c.better == "lower"]
    best = next(c.header for c in cols if c.best)
    name = "rows: router/replica policy; " if kind == CLUSTER else ""
    text = (
        f"{name}{'; '.join(parts)}. Higher is better: {', '.join(higher)}; lower: "
        f"{', '.join(lower)}. {BEST_MARK} best {best} as printed; {TIE_MARK} tied for best "
        "(no mark when all tie; bound: rows never). All fields: the JSON, `feather show --csv`."
    )
    return textwrap.fill(text, width)


LEGEND = legend(ENGINE)
"""The legend of every column of one engine's table."""
