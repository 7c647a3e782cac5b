"""What a simulation records, and the summary numbers `feather bench` reports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str
    arrival: float
    first_token: float
    finish: float
    prompt_len: int
    output_len: int
    preemptions: int = 0

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def latency(self) -> float:
        """End to end: arrival to last token."""
        return self.finish - self.arrival

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (None for a one-token output)."""
        if self.output_len <= 1:
            return None
        return (self.finish - self.first_token) / (self.output_len - 1)


class StepLog:
    """Per-step series, appended cheaply (plain lists) and frozen into numpy at the end."""

    FIELDS = ("time", "duration", "batch", "decodes", "prefill_tokens", "groups", "kv_bytes")

    def __init__(self) -> None:
        self._cols: tuple[list, ...] = tuple([] for _ in self.FIELDS)

    def append(self, *values: float) -> None:
        for col, v in zip(self._cols, values, strict=True):
            col.append(v)

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(col) for name, col in zip(self.FIELDS, self._cols)}


# Summary fields measured on the host's clock: they vary run to run, unlike everything else.
TIMING_KEYS = frozenset(
    {"sim_wall_s", "sched_us_per_step", "sched_us_per_decision", "engine_admit_us_per_step"}
)


@dataclass(frozen=True)
class SLO:
    """Service-level objective for goodput: a request meets it when its TTFT is at most
    `ttft_s` and its TPOT at most `tpot_s` (None: that bound is not checked)."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, r: RequestRecord) -> bool:
        return self.within(r.ttft, r.tpot)

    def within(self, ttft: float | None, tpot: float | None) -> bool:
        """Whether a request's TTFT and TPOT (seconds) meet the bounds. An unknown TTFT (no
        token seen) fails a TTFT bound; an unknown TPOT (one output token) meets any."""
        if self.ttft_s is not None and (ttft is None or ttft > self.ttft_s):
            return False
        return self.tpot_s is None or tpot is None or tpot <= self.tpot_s


PERCENTILES = (50, 90, 99)


def percentiles(name: str, values: Sequence[float], digits: int = 4) -> dict[str, float | None]:
    """`{name}_p50_s`, `_p90_s`, `_p99_s` of the values (None when there are none), rounded
    to `digits` decimals."""
    arr = np.asarray(values, dtype=np.float64)
    if not arr.size:
        return {f"{name}_p{q}_s": None for q in PERCENTILES}
    found = np.percentile(arr, PERCENTILES)
    return {f"{name}_p{q}_s": round(float(v), digits) for q, v in zip(PERCENTILES, found)}


def latency_summary(
    records: list[RequestRecord], makespan_s: float, slo: SLO | None = None
) -> dict[str, float | None]:
    """TTFT, TPOT and end-to-end latency percentiles, and goodput: requests per second
    (over the makespan) that met the SLO (every request, without one)."""
    slo = slo or SLO()
    met = sum(1 for r in records if slo.met(r))
    tpots = [t for r in records if (t := r.tpot) is not None]
    return {
        **percentiles("ttft", [r.ttft for r in records]),
        **percentiles("tpot", tpots),
        **percentiles("latency", [r.latency for r in records]),
        "slo_met": met,
        "goodput_req_s": round(met / makespan_s, 4) if makespan_s > 0 else None,
    }


def preemption_spread(per_request: list[int]) -> dict[str, float]:
    """How preemptions fall on requests: the most any one suffered, and the 99th percentile
    (thrash shows as a few long prompts preempted tens of times)."""
    if not per_request:
        return {"preempt_max": 0, "preempt_p99": 0.0}
    return {
        "preempt_max": int(max(per_request)),
        "preempt_p99": round(float(np.percentile(per_request, 99)), 2),
    }


@dataclass
class SimResult:
    policy: str
    records: list[RequestRecord]
    steps: dict[str, np.ndarray]
    sched_cpu_s: float
    wall_s: float
    preemptions: int
    forced_admissions: int
    """Admissions made against the policy's order: the host's never-stall admissions (the
    policy stopped while nothing ran) plus the policy's own starvation admits."""
    prefix_hit_rate: float
    num_kv_blocks: int
    extra: dict = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return int(self.steps["time"].size)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_len for r in self.records)

    @property
    def makespan_s(self) -> float:
        if not self.records:
            return 0.0
        return max(r.finish for r in self.records) - min(r.arrival for r in self.records)

    @property
    def output_tok_s(self) -> float:
        span = self.makespan_s
        return self.output_tokens / span if span > 0 else 0.0

    def summary(self, slo: SLO | None = None) -> dict[str, float | int | str | None]:
        """The numbers `feather bench` reports for one (policy, workload) run; goodput
        counts the requests that met `slo`."""
        batch = self.steps["batch"]
        dur = self.steps["duration"]
        steps = max(1, self.num_steps)
        return {
            "policy": self.policy,
            "requests": len(self.records),
            "output_tokens": self.output_tokens,
            "makespan_s": round(self.makespan_s, 4),
            "output_tok_s": round(self.output_tok_s, 2),
            "mean_batch": round(float(batch.mean()), 2) if batch.size else 0.0,
            "time_weighted_batch": round(float((batch * dur).sum() / dur.sum()), 2)
            if dur.sum() > 0
            else 0.0,
            "mean_prefix_groups": round(float(self.steps["groups"].mean()), 2)
            if batch.size
            else 0.0,
            "mean_step_ms": round(float(dur.mean()) * 1e3, 4) if dur.size else 0.0,
            **latency_summary(self.records, self.makespan_s, slo),
            "sched_us_per_step": round(self.sched_cpu_s / steps * 1e6, 2),
            "steps": self.num_steps,
            "preemptions": self.preemptions,
            **preemption_spread([r.preemptions for r in self.records]),
            "forced_admissions": self.forced_admissions,
            "prefix_hit_rate": round(self.prefix_hit_rate, 4),
            "sim_wall_s": round(self.wall_s, 3),
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in self.extra.items()},
        }
