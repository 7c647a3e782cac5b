"""The scheduler's own CPU per engine step, by policy: a cost model fitted from points.

An engine spends CPU forming each batch (its policy's pass over the waiting queue, then its
admission loop); the simulator puts this model's figure on its clock (`sim.sched_cpu`). One
row per policy family: seconds per pass, per waiting request walked, per admission and per
arrival (Feather hashes each prompt into its CHT on arrival). The rows are fitted at load from
`sim/scheduler_cpu.json`, SGLang's own classes as timed; each row is `measured` or an
`estimate` borrowed from a measured row (its note says which and why).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

__all__ = [
    "SCHEDULER_CPU_MODES",
    "CpuRow",
    "SchedulerCpuModel",
    "fit_line",
    "load_scheduler_cpu",
]

SCHEDULER_CPU_MODES = ("model", "measured", "off")
"""`--scheduler-cpu`: this model; the policy's own Python CPU as the simulator times it
(host-dependent, not reproducible); none."""

PREFIX_MATCH_MAX = 128
"""SGLang's `WAITING_QUEUE_PREFIX_MATCH_MAX`: above it lpm and hrrn fall back to fcfs
(the same constant as `policies.sglang_baselines`; cost/ imports nothing of the package)."""

Points = Mapping[int, float]
"""Queue length -> a measured figure."""


def fit_line(points: Points) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through `points`, both clamped to >= 0
    (a negative fixed cost or a cost falling with the queue is noise, not a cost)."""
    xs = sorted(points)
    if len(xs) < 2:
        raise ValueError("a line needs points at two queue lengths at least")
    mx = sum(xs) / len(xs)
    my = sum(points[x] for x in xs) / len(xs)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, sum((x - mx) * (points[x] - my) for x in xs) / sxx)
    intercept = max(0.0, sum(points[x] - slope * x for x in xs) / len(xs))
    return intercept, slope


def fit_error(points: Points, intercept: float, slope: float) -> float:
    """Largest relative error of the line at the measured points."""
    return max(abs(intercept + slope * x - y) / y for x, y in points.items() if y > 0)


@dataclass(frozen=True)
class CpuRow:
    """One policy family's CPU per engine step, in seconds."""

    family: str
    per_pass_s: float
    per_waiting_s: float
    per_admission_s: float
    per_arrival_s: float = 0.0
    provenance: str = "measured"
    """`measured` (fitted from its own series of the record) or `estimate`."""
    note: str = ""
    """Which series it is fitted from, and its fit error; for an estimate, what it borrows
    and why."""
    match_max: int | None = None
    """Above this many waiting, `fallback` prices the pass (SGLang's lpm and hrrn)."""
    fallback: CpuRow | None = None

    def pass_s(self, waiting: int, admitted: int) -> float:
        """One pass over `waiting` requests that admitted `admitted`."""
        row = self
        if self.match_max is not None and waiting > self.match_max and self.fallback:
            row = self.fallback
        fixed = row.per_pass_s + row.per_waiting_s * waiting
        return fixed + self.per_admission_s * admitted

    def arrivals_s(self, arrived: int) -> float:
        return self.per_arrival_s * arrived


@dataclass(frozen=True)
class SchedulerCpuModel:
    """The rows by family, the policies each prices, and the record they come from."""

    rows: Mapping[str, CpuRow]
    policies: Mapping[str, str]
    """Policy name -> its family."""
    record: str
    provenance: str
    """One line for a run's header and record: the record, its command, machine and clock."""

    def for_policy(self, name: str) -> CpuRow:
        family = self.policies.get(name)
        if family is None:
            raise ValueError(
                f"--scheduler-cpu model has no CPU row for policy {name!r} (rows for: "
                f"{', '.join(self.policies)}); use --scheduler-cpu measured or off"
            )
        return self.rows[family]


def _series(points: Mapping[str, Mapping[str, float]]) -> dict[str, dict[int, float]]:
    """The record's series keyed by queue length, with the derived ones: SGLang's adder
    per admission (lpm's formation less its priority pass, over the admitted), and
    Feather's pass (its formation less that adder work: what it adds over lpm as shipped,
    plus lpm's priority pass)."""
    s = _keyed(points)
    lpm_form, lpm_prio = s["lpm_batch_formation_ms"], s["lpm_calc_priority_ms"]
    s["adder_per_admission_ms"] = _adder_per_admission(s)
    # Feather's formation less SGLang's adder work (priority + Feather's whole part of it)
    s["feather_pass_ms"] = {
        n: s["feather_batch_formation_ms"][n] - (lpm_form[n] - lpm_prio[n]) for n in lpm_form
    }
    return s


def _keyed(points: Mapping[str, Mapping[str, float]]) -> dict[str, dict[int, float]]:
    """A points file's series keyed by queue length (JSON keys are strings)."""
    return {k: {int(n): float(v) for n, v in p.items()} for k, p in points.items()}


def _adder_per_admission(s: Mapping[str, Mapping[int, float]]) -> dict[int, float]:
    """SGLang's adder per admission: lpm's formation less its priority pass, over the
    admitted (ms, by queue length)."""
    form, prio, admitted = s["lpm_batch_formation_ms"], s["lpm_calc_priority_ms"], s["lpm_admitted"]
    return {n: (form[n] - prio[n]) / admitted[n] for n in form}


def _row(family: str, s: dict[str, dict[int, float]], key: str, admit: float, **kw) -> CpuRow:
    """A row fitted from series `key` (ms); `admit` the engine's seconds per admission."""
    b, m = fit_line(s[key])
    note = f"{key}: {b:.3f} ms + {m * 1e3:.3f} us/waiting, fit error {fit_error(s[key], b, m):.1%}"
    if kw.get("note"):
        note = f"{kw.pop('note')}; {note}"
    return CpuRow(family, b * 1e-3, m * 1e-3, admit, note=note, **kw)


_FEATHER_HOST = "feather-host"
_FEATHER_OTHER = "feather-other"
_POLICIES = {
    "fcfs": "fcfs",
    "vllm-cache-aware": "fcfs",  # FCFS's pass; its window's prefix probes are not priced
    "lpm": "lpm",
    "hrrn": "hrrn",
    "shortest-prefill-first": "shortest-prefill-first",
    "dfs-weight": "dfs-weight",
    "lof": "lof",
    "random": "random",
    "grouped": _FEATHER_HOST,
    "feather": "feather",
    "feather-hold": "feather",
    "feather-paper": _FEATHER_OTHER,
    "feather-upstream": _FEATHER_OTHER,
    "feather-ppo": _FEATHER_OTHER,
    "max-homogeneous": "max-homogeneous",
}
"""Policy -> family (the bench's oracle is grouped with a batch cap: the host's row)."""


def _rows(s: dict[str, dict[int, float]], feather: Mapping[str, Any] | None) -> dict[str, CpuRow]:
    """Every family's row from the record's series (`_series`); the feather policy's from
    its own record's section (`feather`, see `_feather_rows`), where the points file has one."""
    admit = sum(s["adder_per_admission_ms"].values()) / len(s["adder_per_admission_ms"]) * 1e-3
    fcfs = _row("fcfs", s, "fcfs_calc_priority_ms", admit)
    shipped = _row("lpm-fallback", s, "lpm_calc_priority_ms", admit)
    lpm = _row("lpm", s, "lpm_matching_calc_priority_ms", admit)
    lpm = _with(
        lpm,
        match_max=PREFIX_MATCH_MAX,
        fallback=shipped,
        note=lpm.note + f"; above "
        f"{PREFIX_MATCH_MAX} waiting SGLang's fallback to fcfs, {shipped.note}",
    )
    hashed = s["feather_hash_per_request_us"]
    arrive = sum(hashed.values()) / len(hashed) * 1e-6
    host = _row(_FEATHER_HOST, s, "feather_pass_ms", admit, per_arrival_s=arrive)
    host = _with(host, note=host.note + f"; prompt hashed on arrival {arrive * 1e6:.1f} us")
    return {
        "fcfs": fcfs,
        "lpm": lpm,
        "hrrn": _estimate(
            lpm,
            "hrrn",
            "lpm's: SGLang's hrrn runs the same prefix matching and "
            "fallback, then sorts by response ratio (not measured)",
        ),
        "shortest-prefill-first": _estimate(
            _with(lpm, match_max=None, fallback=None),
            "shortest-prefill-first",
            "lpm's matching at every queue length (SGLang does not fall back for it)",
        ),
        "dfs-weight": _row("dfs-weight", s, "dfs-weight_calc_priority_ms", admit),
        "lof": _estimate(
            fcfs,
            "lof",
            "fcfs's pass: a sort without prefix matching (the sort "
            "itself not measured: an understatement)",
        ),
        "random": _estimate(fcfs, "random", "fcfs's pass: a shuffle without prefix matching"),
        _FEATHER_HOST: host,
        **_feather_rows(host, feather, admit),
        "max-homogeneous": _estimate(
            host,
            "max-homogeneous",
            "the Feather host's pass: a reference policy on the CHT, not an engine's",
        ),
    }


def _feather_rows(
    host: CpuRow, section: Mapping[str, Any] | None, admit: float
) -> dict[str, CpuRow]:
    """The feather policy's row and its kin's: measured where the points file has the
    policy's own section (`_measured_feather`), else the host's pass stands in (an
    estimate). The authors' policies and feather-ppo run on the same host with their own
    decisions, not measured: they borrow feather's row."""
    if section is None:
        feather = _estimate(
            host,
            "feather",
            "the Feather host's pass (measured with grouped); "
            "the bandit's own decision work on top is not in the record",
        )
    else:
        feather = _measured_feather(host, section, admit)
    other = _estimate(
        feather,
        _FEATHER_OTHER,
        "feather's row: another policy's decisions on the same Feather host (not measured)",
    )
    return {"feather": feather, _FEATHER_OTHER: other}


def _measured_feather(host: CpuRow, section: Mapping[str, Any], admit: float) -> CpuRow:
    """feather's row from `feather sglang-bench --policy feather --running R`, whose
    formations run beside a running batch (without one the grouping judge walks the whole
    queue and the bandit is never asked: not a server's pass). Its pass is its formation less
    SGLang's adder work for what it admitted, at that record's own adder cost per admission;
    an admission and an arrival are priced as the host's."""
    p = _keyed(section["points"])
    adder = _adder_per_admission(p)
    own = {
        n: p["feather_batch_formation_ms"][n] - adder[n] * p["feather_admitted"][n] for n in adder
    }
    finished = section.get("finished", 0)
    changed = f", {finished} finished since the last pass" if finished else ""
    where = (
        f"{section['record']}: the feather policy beside a running batch of "
        f"{section['running']} of {section['max_running']}{changed}"
    )
    series = {"feather_policy_pass_ms": own}
    key = "feather_policy_pass_ms"
    return _row("feather", series, key, admit, per_arrival_s=host.per_arrival_s, note=where)


def _with(row: CpuRow, **changes: Any) -> CpuRow:
    return dataclasses.replace(row, **changes)


def _estimate(row: CpuRow, family: str, why: str) -> CpuRow:
    return _with(row, family=family, provenance="estimate", note=f"estimate, {why}; {row.note}")


def build(data: Mapping[str, Any]) -> SchedulerCpuModel:
    """The model from a points file (`sim/scheduler_cpu.json`'s format)."""
    s = _series(data["points"])
    feather = data.get("feather_policy")
    rows = _rows(s, feather)
    missing = sorted({f for f in _POLICIES.values() if f not in rows})
    if missing:
        raise ValueError(f"scheduler CPU families without a row: {', '.join(missing)}")
    provenance = (
        f"fitted from {data['record']} ({data['command']}; SGLang {data['sglang']}, "
        f"{data['machine']}, {data['clock']})"
    )
    if feather is not None:
        provenance += f"; the feather policy's row from {feather['record']} ({feather['command']})"
    return SchedulerCpuModel(rows, dict(_POLICIES), data["record"], provenance)


@cache
def load_scheduler_cpu() -> SchedulerCpuModel:
    """The built-in model, fitted from the record its points were copied from."""
    path = resources.files(__package__).joinpath("scheduler_cpu.json")
    return build(json.loads(path.read_text("utf-8")))


def check_mode(mode: str) -> str:
    """`mode` if it is one of `SCHEDULER_CPU_MODES`, else a ValueError naming the valid ones."""
    if mode not in SCHEDULER_CPU_MODES:
        raise ValueError(
            f"--scheduler-cpu {mode!r}: no such mode; valid: {', '.join(SCHEDULER_CPU_MODES)}"
        )
    return mode
