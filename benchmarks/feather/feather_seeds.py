"""Feather's robustness over workload seeds: a cold bandit (with the bench's step-cost prior)
vs FCFS, the oracle and the best of the baselines, per seed.

`feather bench` runs the suite on one seed; this reruns its long-prefix-shaped workloads on
several, sweeping the oracle again for each seed (the best cap depends on the draw). Usage:
  python benchmarks/feather/feather_seeds.py --seeds 0,1,2 --json \
      benchmarks/feather/feather-seeds.json
"""

from __future__ import annotations

import argparse

from feather_lab.bench.oracle import oracle_sweep
from feather_lab.bench.record import write_record
from feather_lab.bench.suite import BenchSpec, build_workload
from feather_lab.sim.engine import simulate
from feather_sched.cost import StepCostModel
from feather_sched.policies.registry import make_policy

WORKLOADS = [
    "shared-prefix",
    "long-prefix",
    "document-qa",
    "paper-2g",
    "paper-5g",
    "paper-20g",
    "paper-100g",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cost = StepCostModel("h100", "llama-3-8b", "paged")
    spec = BenchSpec()
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for name in WORKLOADS:
            requests = build_workload(name).generate(seed)
            engine = spec.engine_for(name)
            policy = make_policy("feather", cost=spec.feather_cost())
            feather = simulate(requests, policy, cost, engine).output_tok_s
            speeds = {
                p: simulate(requests, make_policy(p), cost, engine).output_tok_s
                for p in ("fcfs", "dfs-weight", "max-homogeneous")
            }
            speeds["oracle"] = oracle_sweep(requests, cost, engine).output_tok_s
            best = max(speeds, key=speeds.__getitem__)
            rows.append(
                {
                    "seed": seed,
                    "workload": name,
                    "feather": round(feather, 1),
                    **{p: round(v, 1) for p, v in speeds.items()},
                    "feather_vs_fcfs": round(feather / speeds["fcfs"], 3),
                    "feather_vs_oracle": round(feather / speeds["oracle"], 3),
                    "feather_vs_best": round(feather / max(feather, speeds[best]), 3),
                    "best_baseline": best,
                }
            )
            print(rows[-1], flush=True)
    if args.json:
        write_record(args.json, rows=rows)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
