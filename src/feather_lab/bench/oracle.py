"""The `oracle` bound: the best fixed batch-size cap for one workload, found by sweeping.

For each cap the prefix-grouped order (`GroupedPolicy`) runs the whole workload in the
simulator; the cap with the highest output tokens/s wins. It is a bound, not a policy one
could deploy: it needs the workload in advance and one full run per cap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.sim.result import SimResult
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.grouped import GroupedPolicy
from feather_sched.request import Request


def default_caps(max_num_seqs: int) -> list[int]:
    """Powers of two from 2 up to, and including, the engine's max_num_seqs."""
    caps, c = [], 2
    while c < max_num_seqs:
        caps.append(c)
        c *= 2
    return [*caps, max_num_seqs]


def oracle_sweep(
    requests: Sequence[Request],
    cost: StepCostModel,
    config: EngineConfig,
    caps: Sequence[int] | None = None,
    on_run: Callable[[int, SimResult], None] | None = None,
) -> SimResult:
    """Run every cap; return the best result, relabelled `oracle`, with the sweep attached."""
    caps = list(caps) if caps is not None else default_caps(config.max_num_seqs)
    if not caps:
        raise ValueError("oracle needs at least one cap")
    best: SimResult | None = None
    sweep: dict[int, float] = {}
    for cap in caps:
        result = simulate(requests, GroupedPolicy(max_batch=cap), cost, config)
        sweep[cap] = result.output_tok_s
        if on_run is not None:
            on_run(cap, result)
        if best is None or result.output_tok_s > best.output_tok_s:
            best = result
            best_cap = cap
    assert best is not None
    best.policy = "oracle"
    best.extra["oracle_cap"] = best_cap
    best.extra["oracle_sweep"] = {str(k): round(v, 2) for k, v in sweep.items()}
    return best
