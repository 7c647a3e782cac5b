"""Behaviour check for refactors: every summary field (timings aside) of 84 simulator runs.

7 workloads x 2 KV sizes (the H100's, and 3,000 blocks: preemptions) x 6 policies (fcfs,
grouped, feather with its prior, feather-paper, feather-upstream, dfs-weight) on H100 (the
profile derived from the measured H200) + Llama-3.1-8B, the scheduler seeing exact outputs and
its CPU off the clock (what the policies decide, not a CPU model's figures). Run it on the code
before and after a change and compare: identical means the change kept the simulator's
behaviour. benchmarks/sim/check.json is the baseline; a change that moves a policy's decisions
on purpose re-bases it, and its commit says which runs moved.
Usage: python benchmarks/sim/sim_check.py OUT.json [--against BEFORE.json]"""

from __future__ import annotations

import argparse
import json

from feather_lab.bench.machine import write_record
from feather_lab.bench.suite import build_workload
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.sim.result import TIMING_KEYS
from feather_sched.cost import StepCostModel
from feather_sched.policies.registry import make_policy

WORKLOADS = ["shared-prefix", "long-prefix", "document-qa", "multi-turn", "tree", "no-sharing"]
WORKLOADS += ["paper-5g"]
POLICIES = ["fcfs", "grouped", "feather", "feather-paper", "feather-upstream", "dfs-weight"]
MODEL = "llama-3.1-8b"
SEES = "exact"
"""The scheduler sees every request's true output, as the baseline was recorded (the bench's
default, `cap`, prices outputs from the run instead: a behaviour of its own)."""


def summaries() -> dict[str, dict]:
    cost = StepCostModel("h100", MODEL)
    out = {}
    for workload in WORKLOADS:
        requests = build_workload(workload).generate(0)
        for kv in (None, 3000):
            engine = EngineConfig(
                num_kv_blocks=kv, scheduler_cpu="off", scheduler_sees_output=SEES
            )
            for name in POLICIES:
                options = {"hardware": "h100", "model": MODEL} if name == "feather" else {}
                s = simulate(requests, make_policy(name, **options), cost, engine).summary()
                keep = {k: v for k, v in s.items() if k not in TIMING_KEYS and k != "sim_wall_s"}
                out[f"{workload}/{kv}/{name}"] = keep
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--against", default=None)
    args = parser.parse_args()
    runs = summaries()
    write_record(args.out, runs=runs)
    if args.against:
        with open(args.against) as f:
            before = json.load(f)["runs"]
        differ = sorted(k for k in runs if runs[k] != before.get(k))
        print(f"{len(runs) - len(differ)} of {len(runs)} runs identical; differ: {differ}")


if __name__ == "__main__":
    main()
