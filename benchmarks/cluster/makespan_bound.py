"""The most any router could gain over a recorded row: a makespan no router beats.

Throughput in the cluster grid is output tokens over makespan, and no request can finish
before it arrives plus its own service: its suffix prefilled and its output decoded alone
on an idle replica with its whole prefix already cached (the step model of the grid's
hardware profile, one row a step). The largest of these over a workload's requests is a
makespan no router and no replica policy beats, so a record's row over it is the
ceiling of any router's gain on that cell. Usage:
  python benchmarks/cluster/makespan_bound.py benchmarks/cluster/cluster-grid.json \
      --workloads long-context --pair prefix-affinity/fcfs
"""

from __future__ import annotations

import argparse
import functools
import json

from feather_lab.bench.suite import BenchSpec
from feather_lab.workloads.presets import build_workload
from feather_sched.cost.resolve import resolve_cost
from feather_sched.cost.step_model import BatchShape, StepCostModel


def solo_service_s(cost: StepCostModel, prompt: int, output: int, suffix: int) -> float:
    """Seconds to prefill `suffix` tokens after a cached prompt and decode `output` tokens
    alone: the least any replica needs for the request."""
    t = cost.step_time(
        BatchShape(
            num_prefill_tokens=suffix,
            prefill_attn_pairs=suffix * prompt,
            num_prefill_seqs=1,
            logical_kv_tokens=prompt,
            unique_kv_tokens=prompt,
        )
    )
    for k in range(output):
        ctx = prompt + k
        t += cost.step_time(BatchShape(num_decode=1, logical_kv_tokens=ctx, unique_kv_tokens=ctx))
    return t


@functools.cache
def makespan_bound(workload: str, seed: int, hardware: str, suffix: int) -> float:
    """The makespan no router beats on `workload`'s `seed` (module doc)."""
    spec = BenchSpec(workloads=(workload,), seed=seed, hardware=hardware)
    cost = resolve_cost(spec.hardware, spec.model, spec.kernel)
    reqs = build_workload(workload).generate(seed)
    first = min(r.arrival_time for r in reqs)
    return max(
        r.arrival_time - first + solo_service_s(cost, r.prompt_len, r.output_len, suffix)
        for r in reqs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("record", help="a cluster_grid.py record")
    parser.add_argument("--workloads", default="long-context")
    parser.add_argument("--pair", default="prefix-affinity/fcfs")
    parser.add_argument("--suffix", type=int, default=128, help="uncached prompt tokens")
    args = parser.parse_args()
    with open(args.record) as f:
        record = json.load(f)
    hardware = record["config"]["hardware"]
    print(f"{'workload':<14} {'seed':>4} {'N':>2} {'bound s':>8} {args.pair + ' s':>24} ceiling")
    for row in record["rows"]:
        if row["workload"] not in args.workloads.split(","):
            continue
        if f"{row['router']}/{row['policy']}" != args.pair:
            continue
        bound = makespan_bound(row["workload"], row["seed"], hardware, args.suffix)
        print(
            f"{row['workload']:<14} {row['seed']:>4} {row['replicas']:>2} {bound:>8.2f} "
            f"{row['makespan_s']:>24.2f} {row['makespan_s'] / bound:.3f}x"
        )


if __name__ == "__main__":
    main()
