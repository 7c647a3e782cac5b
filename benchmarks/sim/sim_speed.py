"""Simulator speed: the default shared-prefix workload (1,024 requests) under each baseline.

The learned policy trains on the simulator, so it has to be fast: the target is under 5 s of
one core per run. Usage: python benchmarks/sim/sim_speed.py [--json benchmarks/sim/sim-speed.json]
"""

from __future__ import annotations

import argparse
import time

from feather_lab.bench.record import write_record
from feather_lab.bench.suite import build_workload
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_sched.cost import StepCostModel
from feather_sched.policies.registry import make_policy

POLICIES = ["fcfs", "lpm", "dfs-weight", "lof", "random", "max-homogeneous", "grouped", "feather"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    requests = build_workload("shared-prefix").generate(0)
    cost = StepCostModel("h100", "llama-3-8b")
    rows = []
    for name in POLICIES:
        best_cpu = best_wall = float("inf")
        for _ in range(args.repeats):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            result = simulate(requests, make_policy(name), cost, EngineConfig())
            best_wall = min(best_wall, time.perf_counter() - wall0)
            best_cpu = min(best_cpu, time.process_time() - cpu0)
        rows.append(
            {
                "policy": name,
                "requests": len(requests),
                "steps": result.num_steps,
                "cpu_s": round(best_cpu, 3),
                "wall_s": round(best_wall, 3),
                "us_per_step": round(best_cpu / result.num_steps * 1e6, 1),
            }
        )
        print(f"{name:16s} {best_cpu:6.2f} s cpu  {result.num_steps} steps")
    if args.json:
        write_record(args.json, rows=rows)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
