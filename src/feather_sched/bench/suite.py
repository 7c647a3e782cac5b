"""`feather bench`: run policies x workloads in the simulator, collect comparable rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from feather_sched.bench.oracle import default_caps, oracle_sweep
from feather_sched.policies.registry import make_policy, policy_names
from feather_sched.sim.config import EngineConfig
from feather_sched.sim.cost.step_model import StepCostModel
from feather_sched.sim.engine import simulate
from feather_sched.workloads import make_workload
from feather_sched.workloads.base import Workload

# The built-in suite (H100 + Llama-3-8B by default). Sizes keep a full run in a few minutes
# on 2 CPU cores while each workload still fills the engine's 256-sequence batches.
DEFAULT_WORKLOADS: dict[str, dict] = {
    # SGLang's generated-shared-prefix shape: 64 system prompts x 16 questions.
    "shared-prefix": {},
    # The paper's long-prefix case: 5 groups of 10,000-token prefixes, 20-token suffixes.
    "long-prefix": {"num_prefixes": 5, "requests_per_prefix": 200},
    "document-qa": {},
    "no-sharing": {},
}
DEFAULT_POLICIES = [
    "fcfs",
    "lpm",
    "dfs-weight",
    "lof",
    "random",
    "max-homogeneous",
    "feather",
    "oracle",
]
BASELINE = "fcfs"


@dataclass(frozen=True)
class BenchSpec:
    workloads: Sequence[str] = tuple(DEFAULT_WORKLOADS)
    policies: Sequence[str] = tuple(DEFAULT_POLICIES)
    hardware: str = "h100"
    model: str = "llama-3-8b"
    kernel: str = "paged"
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)

    def validate(self) -> None:
        known = {*policy_names(), "oracle"}
        bad = [p for p in self.policies if p not in known]
        if bad:
            raise ValueError(f"unknown policies {bad}; valid: {', '.join(sorted(known))}")
        if not self.policies:
            raise ValueError("no policies to run")
        if not self.workloads:
            raise ValueError("no workloads to run")

    def runs_per_workload(self) -> int:
        n = len(self.policies)
        if "oracle" in self.policies:
            n += len(default_caps(self.engine.max_num_seqs)) - 1
        return n


def build_workload(name: str) -> Workload:
    """A named workload with the suite's settings, or a trace (`trace:PATH`)."""
    return make_workload(name, **DEFAULT_WORKLOADS.get(name, {}))


def run_bench(
    spec: BenchSpec,
    on_progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Simulate every (workload, policy) pair; one summary row each."""
    spec.validate()
    cost = StepCostModel(spec.hardware, spec.model, spec.kernel)
    tick = on_progress or (lambda _label: None)
    rows: list[dict] = []
    for wname in spec.workloads:
        requests = build_workload(wname).generate(spec.seed)
        for pname in spec.policies:
            label = f"{wname} / {pname}"
            if pname == "oracle":
                result = oracle_sweep(
                    requests,
                    cost,
                    spec.engine,
                    on_run=lambda cap, _r, label=label: tick(f"{label} (cap {cap})"),
                )
            else:
                result = simulate(requests, make_policy(pname), cost, spec.engine)
                tick(label)
            row = {"workload": wname, **result.summary()}
            rows.append(row)
    _add_relative(rows)
    return rows


def _add_relative(rows: list[dict]) -> None:
    """`vs_fcfs`: output tokens/s relative to FCFS on the same workload (when it ran)."""
    base = {r["workload"]: r["output_tok_s"] for r in rows if r["policy"] == BASELINE}
    for r in rows:
        b = base.get(r["workload"])
        r["vs_fcfs"] = round(r["output_tok_s"] / b, 3) if b else None
