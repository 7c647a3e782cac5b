"""Scheduler CPU time per admission decision with a deep queue (target: < 20 us at 10,000).

Runs the simulator on a workload whose whole queue (10,000 requests by default) arrives at
once, so every scheduling step sees thousands of waiting requests, and reports each policy's
own CPU time per candidate it was asked about (begin_step + producing candidates + ADD/STOP,
divided by the number of candidates), as `feather bench` measures it.
Usage: python benchmarks/feather/decision_cost.py [--requests 10000] [--json FILE]
"""

from __future__ import annotations

import argparse

from feather_lab.bench.record import write_record
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.workloads import SharedPrefixWorkload
from feather_sched.cost import StepCostModel
from feather_sched.policies.registry import make_policy

POLICIES = ["fcfs", "lpm", "grouped", "feather", "feather+prior"]
# feather+prior: feather with the run's own step-cost model as its prior (as `feather bench`)
OPTIONS = {"feather+prior": ("feather", {"hardware": "h100", "model": "llama-3-8b"})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    groups = max(1, args.requests // 16)
    workload = SharedPrefixWorkload(
        num_groups=groups,
        prompts_per_group=16,
        system_prompt_len=1024,
        question_len=64,
        output_len=16,
    )
    requests = workload.generate(0)
    cost = StepCostModel("h100", "llama-3-8b")
    rows = []
    for name in args.policies.split(","):
        policy, options = OPTIONS.get(name, (name, {}))
        result = simulate(requests, make_policy(policy, **options), cost, EngineConfig())
        s = result.summary()
        rows.append(
            {
                "policy": name,
                "requests": len(requests),
                "decisions": s["decisions"],
                "sched_us_per_decision": round(s["sched_us_per_decision"], 2),
                "sched_us_per_step": s["sched_us_per_step"],
            }
        )
        print(rows[-1], flush=True)
    if args.json:
        write_record(args.json, rows=rows)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
