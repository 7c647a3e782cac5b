"""Feather: prefix-homogeneity-aware request scheduling for LLM serving.

The public API (the rest of the package is reachable, but these are the names kept stable):

- `simulate(workload, policy, hardware=..., model=...)`: one simulated run -> `SimResult`
- `SLO(ttft_s, tpot_s)`: goodput's objective, for `SimResult.summary(slo)`
- `make_workload(name, **overrides)`, `workload_requests(name, seed)`: workloads by name
- `make_policy(name, **options)`, `policy_names()`: policies by name
- `Request`: one request (prompt token ids, output length, arrival time)
"""

from typing import Any

from feather_sched.request import Request

__all__ = [
    "SLO",
    "Request",
    "SimResult",
    "make_policy",
    "make_workload",
    "policy_names",
    "simulate",
    "workload_requests",
]
__version__ = "0.1.0"

_LAZY = {
    "simulate": "feather_sched.api",
    "workload_requests": "feather_sched.api",
    "SLO": "feather_sched.sim.result",
    "SimResult": "feather_sched.sim.result",
    "make_workload": "feather_sched.workloads.registry",
    "make_policy": "feather_sched.policies.registry",
    "policy_names": "feather_sched.policies.registry",
}


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use (so `import feather_sched` stays light)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'feather_sched' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
