"""Feather's lab: the simulator, workloads, benchmarks, engine harnesses and the `feather`
command. Nothing in `feather_sched` imports it.

- `simulate(workload, policy, hardware=..., model=...)`: one simulated run -> `SimResult`
- `SLO(ttft_s, tpot_s)`: goodput's objective, for `SimResult.summary(slo)`
- `make_workload(name, **overrides)`, `workload_requests(name, seed)`: workloads by name
"""

from feather_sched._lazy import lazy_exports

__all__ = ["SLO", "SimResult", "make_workload", "simulate", "workload_requests"]

__getattr__ = lazy_exports(
    __name__,
    {
        "simulate": "feather_lab.api",
        "workload_requests": "feather_lab.api",
        "SLO": "feather_lab.sim.result",
        "SimResult": "feather_lab.sim.result",
        "make_workload": "feather_lab.workloads.registry",
    },
)
