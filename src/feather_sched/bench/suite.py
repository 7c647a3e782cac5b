"""`feather bench`: run policies x workloads in the simulator, collect comparable rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from feather_sched.bench.context import fit_context
from feather_sched.bench.oracle import default_caps, oracle_sweep
from feather_sched.bench.report import add_relative
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.registry import make_policy, policy_names
from feather_sched.sim.config import EngineConfig
from feather_sched.sim.cost.step_model import StepCostModel
from feather_sched.sim.engine import simulate
from feather_sched.workloads.presets import PRESETS, Preset, build_workload

SUITE: dict[str, Preset] = PRESETS["sim"]
"""The built-in suite: its workloads by name (`workloads.presets`, scale "sim")."""
DEFAULT_WORKLOADS = list(SUITE)
DEFAULT_POLICIES = [
    "fcfs",
    "lpm",
    "dfs-weight",
    "lof",
    "random",
    "max-homogeneous",
    "feather",
    "feather-paper",
    "feather-ppo",
    "oracle",
]
BASELINE = "fcfs"


@dataclass(frozen=True)
class BenchSpec:
    workloads: Sequence[str] = tuple(DEFAULT_WORKLOADS)
    policies: Sequence[str] = tuple(DEFAULT_POLICIES)
    hardware: str = "h100"
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

    def feather_options(self) -> dict:
        hw = self.feather_hardware or self.hardware
        if hw == "none":
            return {}
        return {"hardware": hw, "model": self.model, "kernel": self.kernel}

    def validate(self) -> None:
        known = {*policy_names(), "oracle"}
        bad = [p for p in self.policies if p not in known]
        if bad:
            raise ValueError(f"unknown policies {bad}; valid: {', '.join(sorted(known))}")
        if not self.policies:
            raise ValueError("no policies to run")
        if not self.workloads:
            raise ValueError("no workloads to run")

    def engine_for(self, workload: str) -> EngineConfig:
        """The engine settings for one workload: the suite's needs, then explicit options."""
        suite = SUITE.get(workload)
        if suite is None or not suite.engine:
            return self.engine
        changes = {k: v for k, v in suite.engine.items() if k not in self.engine_overrides}
        return dataclasses.replace(self.engine, **changes)

    def total_runs(self) -> int:
        n = 0
        for w in self.workloads:
            n += len(self.policies)
            if "oracle" in self.policies:
                n += len(default_caps(self.engine_for(w).max_num_seqs)) - 1
        return n


def run_bench(
    spec: BenchSpec,
    on_progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Simulate every (workload, policy) pair; one summary row each."""
    spec.validate()
    cost = StepCostModel(spec.hardware, spec.model, spec.kernel)
    tick = on_progress or (lambda _label: None)
    rows: list[dict] = []
    shared_feather = None
    if spec.policy_state is not None and "feather" in spec.policies:
        warm = spec.policy_state.is_file()
        shared_feather = FeatherPolicy(
            policy_state=spec.policy_state if warm else None, **spec.feather_options()
        )
    limit = cost.model.max_context_tokens
    workloads = {}
    for wname in spec.workloads:  # all checked before any run starts
        requests = build_workload(wname).generate(spec.seed)
        workloads[wname] = fit_context(
            requests, limit, spec.drop_overlong, f"{wname} on {spec.model}"
        )
    for wname, (requests, dropped) in workloads.items():
        engine = spec.engine_for(wname)
        for pname in spec.policies:
            label = f"{wname} / {pname}"
            if pname == "oracle":
                result = oracle_sweep(
                    requests,
                    cost,
                    engine,
                    on_run=lambda cap, _r, label=label: tick(f"{label} (cap {cap})"),
                )
            else:
                if pname == "feather":
                    policy = shared_feather or make_policy(pname, **spec.feather_options())
                else:
                    policy = make_policy(pname)
                result = simulate(requests, policy, cost, engine)
                tick(label)
            row = {
                "workload": wname,
                "max_num_seqs": engine.max_num_seqs,
                **result.summary(),
                "dropped_overlong": dropped,
            }
            rows.append(row)
    if shared_feather is not None and spec.policy_state is not None:
        shared_feather.save(spec.policy_state)
    add_relative(rows, BASELINE)
    return rows
