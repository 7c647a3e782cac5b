"""A result row of `feather bench`, typed where the code reads it.

Every bench (the simulator, vLLM, SGLang, the simulated cluster) builds its rows as plain
JSON objects, and the record stores them as they are: that keeps every record ever written
readable and the JSON exactly what the run produced. `Row` is the typed view the table, the
plot, `feather show` and `feather compare` read them through: what identifies a row (its
workload, its policy, and for a cluster run its router and replica count) and how it is
named in a table, decided here once instead of in each reader.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["engine", "cluster"]
ENGINE: Kind = "engine"
"""Rows of one engine (simulated or real): one per (workload, policy)."""
CLUSTER: Kind = "cluster"
"""Rows of `feather bench --replicas`: one per (workload, replicas, router); each router runs
its own replica policy, so the policy alone does not name a row."""

BOUND_PREFIX = "bound:"
"""Rows named `bound:...` are limits (e.g. `bound:unbounded-kv`, the engine's order with KV
capacity unbounded), not policies: never the best of a run."""

LEGACY_NAMES = {"mean_prefix_groups": "prefix_groups_per_batch"}
"""Current field -> its name in older records (cluster rows, before they took the engine's)."""

BLOCK_FIELDS = ("replicas", "seed")
"""Row fields that split one workload's rows into separate blocks when a record holds
several values of them (a cluster grid over replica counts and seeds)."""


@dataclass(frozen=True)
class Row:
    """One row: its identity typed, every field as the JSON has it (in `fields`, in order,
    so reading a record and writing it back changes nothing)."""

    workload: str
    policy: str
    router: str | None
    fields: Mapping[str, Any]

    @classmethod
    def of(cls, row: Row | Mapping[str, Any]) -> Row:
        """A row from a bench's dict or a record's JSON object (or a Row, as is)."""
        if isinstance(row, Row):
            return row
        router = row.get("router")
        router = None if router is None else str(router)
        return cls(str(row["workload"]), str(row["policy"]), router, row)

    @property
    def kind(self) -> Kind:
        return CLUSTER if self.router is not None else ENGINE

    @property
    def name(self) -> str:
        """The row's name within its block, and its series in a plot: the policy, or for a
        cluster row `router/replica policy` (two routers may share a replica policy)."""
        return f"{self.router}/{self.policy}" if self.router is not None else self.policy

    @property
    def label(self) -> str:
        """The name as a table prints it: the oracle's row says which cap won."""
        cap = self.fields.get("oracle_cap")
        return self.name + (f" (cap {cap})" if cap is not None else "")

    @property
    def is_bound(self) -> bool:
        return self.policy.startswith(BOUND_PREFIX)

    @property
    def block(self) -> tuple[Any, ...]:
        """The block the row is printed in: its workload, then its replicas and seed where
        the row has them."""
        return (self.workload, *(self.fields.get(k) for k in BLOCK_FIELDS))

    def value(self, key: str) -> float | None:
        """The field as a number; None when missing, not a number, or NaN. A record written
        before a field was renamed is read under its old name (`LEGACY_NAMES`)."""
        v = self.fields.get(key, self.fields.get(LEGACY_NAMES.get(key, "")))
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        return None if isinstance(v, float) and math.isnan(v) else v

    def to_json(self) -> dict[str, Any]:
        return dict(self.fields)


def as_rows(rows: Iterable[Row | Mapping[str, Any]]) -> list[Row]:
    return [Row.of(r) for r in rows]


def kind_of(rows: Sequence[Row]) -> Kind:
    """A record's kind: cluster as soon as a row names its router."""
    return CLUSTER if any(r.kind == CLUSTER for r in rows) else ENGINE


def baseline_of(rows: Sequence[Row]) -> str:
    """What the relative-throughput column compares with: fcfs on one engine (vLLM's and
    SGLang's own scheduler is stored as `vs_fcfs` too), the first router on a cluster."""
    routers = [r.router for r in rows if r.router is not None]
    return routers[0] if routers else "fcfs"


def blocks(rows: Sequence[Row]) -> list[list[Row]]:
    """The rows by block, blocks in order of first appearance."""
    out: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        out.setdefault(r.block, []).append(r)
    return list(out.values())


def by_workload(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """A record's plain rows as workload label -> policy -> row, in the record's order."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        table.setdefault(row["workload"], {})[row["policy"]] = row
    return table


def block_title(rows: Sequence[Row]) -> str:
    """A block's title line: the workload, its replicas and seed when rows carry them, the
    request count and the requests dropped as overlong."""
    first = rows[0]
    f = first.fields
    parts = [first.workload]
    if f.get("replicas") is not None:
        parts.append(f"{f['replicas']} replicas")
    if f.get("seed") is not None:
        parts.append(f"seed {f['seed']}")
    if isinstance(f.get("requests"), int):
        parts.append(f"{f['requests']:,} requests")
    if f.get("dropped_overlong"):
        parts.append(f"{f['dropped_overlong']:,} dropped as overlong")
    return ", ".join(parts)
