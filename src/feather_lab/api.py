"""The public Python API: one call to simulate a policy on a workload.

    from feather_lab import simulate
    result = simulate("long-prefix", "feather", hardware="h200", model="llama-3.1-8b")
    print(result.summary()["output_tok_s"], result.summary()["ttft_p99_s"])

Workload names are the bench's (`feather list workloads`): the suite's presets, the
generators, or "trace:PATH"; one name is one workload everywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from feather_lab.sim.result import SLO, SimResult
from feather_sched.policies.base import Policy
from feather_sched.request import Request

__all__ = ["SLO", "simulate", "workload_requests"]


def workload_requests(workload: str | Any, seed: int = 0) -> list[Request]:
    """The requests of a workload given by name (as `feather bench -w`), or of a workload
    object (anything with `generate(seed)`), sorted by arrival."""
    if isinstance(workload, str):
        from feather_lab.workloads.presets import build_workload

        workload = build_workload(workload)
    return sorted(workload.generate(seed), key=lambda r: r.arrival_time)


def simulate(
    workload: str | Sequence[Request] | Any,
    policy: str | Policy = "feather",
    *,
    hardware: str = "h200",
    model: str = "llama-3.1-8b",
    kernel: str = "paged",
    seed: int = 0,
    max_num_seqs: int | None = None,
    **engine: Any,
) -> SimResult:
    """Simulate `policy` serving `workload`; the result's `summary(SLO(...))` holds the
    bench's numbers (tokens/s, TTFT/TPOT/latency percentiles, goodput), `records` each
    request's times and `steps` the per-step series.

    `workload`: a name (`feather list workloads`), a workload object or a list of `Request`.
    `policy`: a name (`feather list policies`; `feather` gets the step-cost prior of
    `hardware`/`model`, as in the bench) or a `Policy` instance. `max_num_seqs` defaults to
    the suite's setting for a named workload (500 for paper-*), else 256; `engine` takes any
    other `EngineConfig` field (`num_kv_blocks`, `max_num_batched_tokens`, ...).
    """
    from feather_lab.sim.config import EngineConfig
    from feather_lab.sim.engine import simulate as run
    from feather_lab.workloads.presets import PRESETS
    from feather_sched.cost.resolve import resolve_cost
    from feather_sched.policies.registry import make_policy

    if isinstance(workload, (str,)) or hasattr(workload, "generate"):
        requests = workload_requests(workload, seed)
    else:
        requests = list(workload)
    cost = resolve_cost(hardware, model, kernel)
    if isinstance(policy, str):
        policy = make_policy(policy, cost=cost) if policy == "feather" else make_policy(policy)
    preset = PRESETS["sim"].get(workload) if isinstance(workload, str) else None
    seqs = max_num_seqs or (preset.max_num_seqs if preset else EngineConfig.max_num_seqs)
    config = dataclasses.replace(EngineConfig(), max_num_seqs=seqs, **engine)
    return run(requests, policy, cost, config)
