"""Feather's robustness over workload seeds: a cold bandit vs FCFS and the oracle, per seed.

`feather bench` runs the suite on one seed; this reruns its long-prefix-shaped workloads on
several, sweeping the oracle again for each seed (the best cap depends on the draw). Usage:
  python benchmarks/feather_seeds.py --seeds 0,1,2 --json benchmarks/feather-seeds.json
"""

from __future__ import annotations

import argparse

from feather_sched.bench.machine import write_record
from feather_sched.bench.oracle import oracle_sweep
from feather_sched.bench.suite import BenchSpec, build_workload
from feather_sched.policies.fcfs import FCFSPolicy
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.sim.cost import StepCostModel
from feather_sched.sim.engine import simulate

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
            feather = simulate(requests, FeatherPolicy(), cost, engine).output_tok_s
            fcfs = simulate(requests, FCFSPolicy(), cost, engine).output_tok_s
            oracle = oracle_sweep(requests, cost, engine).output_tok_s
            rows.append(
                {
                    "seed": seed,
                    "workload": name,
                    "feather": round(feather, 1),
                    "fcfs": round(fcfs, 1),
                    "oracle": round(oracle, 1),
                    "feather_vs_fcfs": round(feather / fcfs, 3),
                    "feather_vs_oracle": round(feather / oracle, 3),
                }
            )
            print(rows[-1], flush=True)
    if args.json:
        write_record(args.json, rows=rows)


if __name__ == "__main__":
    main()
