"""Feather's learning curve: window rewards over decisions, and throughput per run.

One FeatherPolicy serves several consecutive runs of a workload (seeds 0..N-1) and keeps
learning across them, as a long-running deployment would; a fresh policy is also run on the
last seed for comparison (warm vs cold). Usage:
  python benchmarks/feather/feather_learning.py --workload paper-5g --runs 5 \
      --plot benchmarks/feather/feather-learning.png
"""

from __future__ import annotations

import argparse
import dataclasses

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from feather_lab.bench.record import write_record
from feather_lab.bench.suite import SUITE, BenchSpec, build_workload
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_sched.cost import StepCostModel
from feather_sched.policies.fcfs import FCFSPolicy
from feather_sched.policies.feather import FeatherPolicy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", default="paper-5g")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--plot", default="benchmarks/feather/feather-learning.png")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cost = StepCostModel("h100", "llama-3-8b")
    suite = SUITE.get(args.workload)
    config = dataclasses.replace(EngineConfig(), **(suite.engine if suite else {}))
    policy = FeatherPolicy(cost=BenchSpec().feather_cost())
    per_run = []
    boundaries = []
    for seed in range(args.runs):
        requests = build_workload(args.workload).generate(seed)
        warm = simulate(requests, policy, cost, config).output_tok_s
        fcfs = simulate(requests, FCFSPolicy(), cost, config).output_tok_s
        per_run.append({"seed": seed, "feather": round(warm, 1), "fcfs": round(fcfs, 1)})
        boundaries.append(policy.total_decisions)
        print(per_run[-1], flush=True)
    cold = simulate(
        build_workload(args.workload).generate(args.runs - 1),
        FeatherPolicy(cost=BenchSpec().feather_cost()),
        cost,
        config,
    ).output_tok_s
    hist = np.array(policy.history, dtype=float)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    if hist.size:
        axes[0].plot(hist[:, 0], hist[:, 1], ".", alpha=0.25, markersize=3, label="window reward")
        k = max(1, len(hist) // 50)
        smooth = np.convolve(hist[:, 1], np.ones(k) / k, mode="valid")
        axes[0].plot(hist[k - 1 :, 0], smooth, color="C1", label=f"moving mean ({k})")
        for b in boundaries[:-1]:
            axes[0].axvline(b, color="grey", linewidth=0.6, linestyle=":")
    axes[0].set_xlabel("ADD/STOP decisions so far")
    axes[0].set_ylabel("tokens/s over the decision's window")
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{args.workload}: rewards (dotted lines: new run)")
    runs = np.arange(args.runs)
    axes[1].plot(
        runs, [r["feather"] for r in per_run], "o-", label="feather (learning across runs)"
    )
    axes[1].plot(runs, [r["fcfs"] for r in per_run], "s--", label="fcfs")
    axes[1].axhline(cold, color="C2", linestyle=":", label=f"cold feather, seed {args.runs - 1}")
    axes[1].set_xlabel("run (workload seed)")
    axes[1].set_ylabel("output tokens/s")
    axes[1].legend(fontsize=8)
    axes[1].set_title("throughput per run")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"cold feather on seed {args.runs - 1}: {cold:.1f} tok/s; wrote {args.plot}")
    if args.json:
        write_record(args.json, runs=per_run, cold_last=round(cold, 1))


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
