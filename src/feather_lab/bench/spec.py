"""What `feather bench` runs: the suite, the defaults and the spec, checked whole before
anything starts."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from feather_lab.bench.oracle import default_caps
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.result import SLO
from feather_lab.sim.scheduler_cpu import check_mode, load_scheduler_cpu
from feather_lab.workloads.arrivals import parse_arrival
from feather_lab.workloads.presets import PRESETS, Preset
from feather_lab.workloads.registry import TRACE_PREFIX
from feather_sched.cost.resolve import prior_cost, resolve_cost
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.registry import policy_names

SUITE: dict[str, Preset] = PRESETS["sim"]
"""The built-in suite: its workloads by name (`workloads.presets`, scale "sim")."""
DEFAULT_WORKLOADS = list(SUITE)
DEFAULT_POLICIES = [
    "fcfs",
    "vllm-cache-aware",
    "lpm",
    "dfs-weight",
    "lof",
    "random",
    "max-homogeneous",
    "feather",
    "feather-paper",
    "feather-upstream",
    "feather-ppo",
    "oracle",
]
BASELINE = "fcfs"
DEFAULT_HARDWARE = "h200"
"""A measured profile: the main job stands on measured ground."""
BOUNDS = frozenset({"oracle", "max-homogeneous"})
"""Rows that are references, not deployable policies (plots draw them apart)."""
MAX_KV_BLOCKS = 1 << 22
"""Most KV blocks the simulator is asked to manage (it keeps state per block)."""


@dataclass(frozen=True)
class BenchCosts:
    """A bench's cost models (`BenchSpec.costs`): checked before any run, then shared by
    every run (a cost model keeps no state)."""

    run: StepCostModel
    """The simulated engine's step times."""
    feather: StepCostModel | None
    """The `feather` policy's prior (None: none, or feather does not run)."""


@dataclass(frozen=True)
class BenchSpec:
    workloads: Sequence[str] = tuple(DEFAULT_WORKLOADS)
    policies: Sequence[str] = tuple(DEFAULT_POLICIES)
    hardware: str = DEFAULT_HARDWARE
    model: str = "llama-3.1-8b"
    kernel: str = "paged"
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    engine_overrides: frozenset[str] = frozenset()
    """Engine fields the user set explicitly; they win over a workload's own settings."""
    policy_state: Path | None = None
    """The `feather` bandit's table: loaded before the runs if the file exists (warm start),
    saved after them; one bandit then learns across all workloads, as a deployment would."""
    feather_hardware: str | None = None
    """Hardware profile `feather` takes as its step-cost prior: None, the bench's own (a
    calibrated deployment); "none", no prior; any other, a mismatched model."""
    drop_overlong: bool = False
    """Drop requests longer than the model's context (counted in the row) instead of
    refusing the run (`bench.context`)."""
    arrival: str | None = None
    """Arrival process of the generated workloads (`all`, `poisson:RATE`,
    `bursts:SIZE:INTERVAL`); None keeps each workload's own. Not for traces."""
    rate_scale: float | None = None
    """Multiplies the request rate: every arrival time is divided by it."""
    limit: int | None = None
    """Keep only each workload's first `limit` requests (by arrival)."""
    slo: SLO = field(default_factory=SLO)
    """Goodput counts the requests that meet it."""
    steps_out: Path | None = None
    """A JSONL step log (`bench.steplog`): one line per simulated step of every run."""
    scheduler_cpu: str = "model"
    """The scheduler's CPU on the simulated clock (`sim.sched_cpu`): `model` (fitted from
    SGLang's own code, `cost.scheduler_cpu`), `measured` or `off`; hidden under the step up
    to its GPU time, as the engines' default async/overlap loops do."""
    rates: tuple[float, ...] | None = None
    """A latency-throughput sweep: each workload run at each of these request rates
    (requests/s; Poisson arrivals for generated workloads, the trace's own timestamps
    rescaled to that mean rate for a trace), one row set per (workload, rate)."""

    def feather_cost(self) -> StepCostModel | None:
        """Feather's step-cost prior by `--feather-hardware`'s one rule (`prior_cost`: unset,
        the bench's own hardware; "none", no prior: None), with the bench's model and kernel."""
        return prior_cost(self.feather_hardware, self.hardware, self.model, self.kernel)

    def costs(self) -> BenchCosts:
        """The bench's cost models, each resolved once from its names (a ValueError names a
        bad one): the simulated engine's, and feather's prior when feather runs."""
        run = resolve_cost(self.hardware, self.model, self.kernel)
        prior = {"feather", "feather-hold"} & set(self.policies)
        return BenchCosts(run, self.feather_cost() if prior else None)

    def validate(self) -> None:
        """Every option checked before anything runs; a ValueError names the bad value."""
        known = {*policy_names(), "oracle"}
        bad = [p for p in self.policies if p not in known]
        if bad:
            raise ValueError(f"unknown policies {bad}; valid: {', '.join(sorted(known))}")
        if not self.policies:
            raise ValueError(f"no policies to run; valid: {', '.join(sorted(known))}")
        dup = sorted({p for p in self.policies if list(self.policies).count(p) > 1})
        if dup:
            raise ValueError(f"policies named twice: {', '.join(dup)}")
        if not self.workloads:
            raise ValueError("no workloads to run")
        if self.arrival is not None:
            parse_arrival(self.arrival)
            traces = [w for w in self.workloads if w.startswith(TRACE_PREFIX)]
            if traces:
                raise ValueError(
                    f"--arrival {self.arrival!r} applies to generated workloads, not to "
                    f"{traces[0]!r} (a trace keeps its own timestamps; use --rate-scale)"
                )
        if self.rate_scale is not None and not (
            math.isfinite(self.rate_scale) and self.rate_scale > 0
        ):
            raise ValueError(f"--rate-scale must be a finite number > 0, got {self.rate_scale}")
        if self.rates is not None:
            if not self.rates or not all(math.isfinite(r) and r > 0 for r in self.rates):
                raise ValueError(
                    f"--rates must be finite request rates > 0, got {list(self.rates)}"
                )
            if self.arrival is not None or self.rate_scale is not None:
                raise ValueError("--rates sets the arrivals: drop --arrival / --rate-scale")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be an integer >= 1, got {self.limit}")
        for name, value in (("--slo-ttft", self.slo.ttft_s), ("--slo-tpot", self.slo.tpot_s)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value}")
        self.check_scheduler_cpu()
        blocks = self.engine.num_kv_blocks
        if blocks is not None and not (1 <= blocks <= MAX_KV_BLOCKS):
            raise ValueError(
                f"--num-kv-blocks must be between 1 and {MAX_KV_BLOCKS:,}, got {blocks:,}"
            )

    def engine_for(self, workload: str) -> EngineConfig:
        """The engine settings for one workload: the suite's needs, then explicit options
        (the scheduler CPU mode is the bench's)."""
        suite = SUITE.get(workload)
        own = suite.engine if suite is not None else {}
        changes = {k: v for k, v in own.items() if k not in self.engine_overrides}
        return dataclasses.replace(self.engine, scheduler_cpu=self.scheduler_cpu, **changes)

    def check_scheduler_cpu(self) -> None:
        """`--scheduler-cpu` names a mode, and under `model` every policy has a CPU row (the
        oracle runs grouped)."""
        check_mode(self.scheduler_cpu)
        if self.scheduler_cpu == "model":
            model = load_scheduler_cpu()
            for name in self.policies:
                model.for_policy("grouped" if name == "oracle" else name)

    def total_runs(self) -> int:
        n = 0
        for w in self.workloads:
            n += len(self.policies) + len(preset_bounds(w))
            if "oracle" in self.policies:
                n += len(default_caps(self.engine_for(w).max_num_seqs)) - 1
        return n * (len(self.rates) if self.rates else 1)


UNBOUNDED_KV = "bound:unbounded-kv"
"""A limit row: the engine's own order (fcfs) with a KV cache that holds every request of the
run at once (no eviction, no preemption), so the table shows how far each policy is from
what memory allows. Left out of best-of-run comparisons (`output.is_bound_row`)."""


def preset_bounds(name: str) -> tuple[str, ...]:
    preset = SUITE.get(name)
    return preset.bounds if preset is not None else ()
