"""The simulator on the CPU-fitted profile, for the `feather bench --engine vllm` workloads.

Predicts what the real CPU engine does with each policy (same workloads, block size, batch
limits and KV sizes as the vLLM bench), so a real-engine result can be told apart from the
policy's own behaviour. Usage:
  python benchmarks/sim_cpu_profile.py --json benchmarks/sim-cpu-profile.json
"""

from __future__ import annotations

import argparse

from feather_sched.bench.machine import write_record
from feather_sched.bench.vllm_engine import TINY_WORKLOADS, VllmBenchSpec
from feather_sched.policies.registry import make_policy
from feather_sched.sim.config import EngineConfig
from feather_sched.sim.cost import StepCostModel
from feather_sched.sim.engine import simulate
from feather_sched.workloads import make_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="benchmarks/cpu-vllm-fitted.json")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cost = StepCostModel(args.profile, "tiny-llama", "paged")
    spec = VllmBenchSpec()
    rows = []
    for name in TINY_WORKLOADS:
        requests = make_workload(name, **TINY_WORKLOADS[name], vocab_size=512).generate(0)
        for scenario in spec.scenarios:
            config = EngineConfig(
                max_num_seqs=spec.max_num_seqs,
                max_num_batched_tokens=spec.max_num_batched_tokens,
                block_size=spec.block_size,
                num_kv_blocks=scenario.num_blocks,
            )
            base = None
            for policy in ("fcfs", "grouped", "feather"):
                result = simulate(requests, make_policy(policy), cost, config)
                base = base or result.output_tok_s
                rows.append(
                    {
                        "workload": name,
                        "scenario": scenario.name,
                        "policy": policy,
                        "output_tok_s": round(result.output_tok_s, 1),
                        "vs_fcfs": round(result.output_tok_s / base, 3),
                        "mean_batch": result.summary()["mean_batch"],
                    }
                )
                print(rows[-1], flush=True)
    if args.json:
        write_record(args.json, profile=args.profile, rows=rows)


if __name__ == "__main__":
    main()
