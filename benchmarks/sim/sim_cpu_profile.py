"""The simulator on a CPU-fitted profile, for the `feather bench --engine vllm` workloads.

Predicts what the real CPU engine does with each policy (same workloads, block size, batch
limits and KV sizes as the vLLM bench of that model), so a real-engine result can be told
apart from the policy's own behaviour. Usage:
  python benchmarks/sim/sim_cpu_profile.py --json benchmarks/sim/cpu-profile.json
  python benchmarks/sim/sim_cpu_profile.py --model kv-bound \
      --profile benchmarks/vllm/cpu-kv-bound-fitted.json
"""

from __future__ import annotations

import argparse

from feather_lab.bench.record import write_record
from feather_lab.harness.vllm_engine import ENGINE_SCALES, VllmBenchSpec, engine_workload
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_sched.cost import StepCostModel
from feather_sched.policies.registry import make_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny-llama", choices=list(ENGINE_SCALES))
    parser.add_argument("--profile", default="benchmarks/vllm/cpu-vllm-fitted.json")
    parser.add_argument("--policies", default="fcfs,grouped,feather")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cost = StepCostModel(args.profile, args.model, "paged")
    spec = VllmBenchSpec(model=args.model).resolved()
    rows = []
    for name in spec.scale.workloads:
        requests = engine_workload(name, 512, 0, spec.scale)
        for scenario in spec.scenarios or ():
            config = EngineConfig(
                max_num_seqs=spec.max_num_seqs,
                max_num_batched_tokens=spec.max_num_batched_tokens,
                block_size=spec.block_size,
                num_kv_blocks=scenario.num_blocks,
                index_chunk_size=spec.block_size,
            )
            base = None
            for policy in args.policies.split(","):
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
        write_record(args.json, model=args.model, profile=args.profile, rows=rows)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
