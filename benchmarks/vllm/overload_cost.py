"""Scheduler cost per decision as an overloaded trace grows (target: the full trace at most 2x
its first 500 requests).

Runs `feather` (and `fcfs`, `grouped` for scale) on the first N requests of a trace for
several N, repeated and interleaved, and reports the median CPU time per candidate the
policy was asked about and per step. Requests over the model's context are dropped, as
`feather bench --drop-overlong` does.
Usage: python benchmarks/vllm/overload_cost.py TRACE.jsonl [--cuts 500,1000,2000,0] [--repeats 3]
    [--json FILE]   (a cut of 0 = the whole trace)
"""

from __future__ import annotations

import argparse
import statistics

from feather_lab.bench.context import fit_context
from feather_lab.bench.record import write_record
from feather_lab.bench.suite import build_workload
from feather_lab.sim.engine import simulate
from feather_sched.cost import StepCostModel
from feather_sched.policies.registry import make_policy

MODEL = "llama-3.1-8b"
PRIOR = {"hardware": "h100", "model": MODEL}


def measure(requests, policy: str) -> tuple[float, float, int]:
    """(us per decision, us per step, decisions) of one run."""
    options = PRIOR if policy == "feather" else {}
    s = simulate(requests, make_policy(policy, **options), StepCostModel("h100", MODEL)).summary()
    return s["sched_us_per_decision"], s["sched_us_per_step"], s["decisions"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trace")
    parser.add_argument("--cuts", default="500,1000,2000,0")
    parser.add_argument("--policies", default="fcfs,grouped,feather")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    full = build_workload(f"trace:{args.trace}").generate(0)
    limit = StepCostModel("h100", MODEL).model.max_context_tokens
    full, dropped = fit_context(full, limit, drop=True, source=args.trace)
    full.sort(key=lambda r: r.arrival_time)
    cuts = [int(c) or len(full) for c in args.cuts.split(",")]
    runs: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
    for _ in range(args.repeats):
        for n in cuts:
            for policy in args.policies.split(","):
                runs.setdefault((policy, n), []).append(measure(full[:n], policy))
    rows = []
    for (policy, n), got in runs.items():
        rows.append(
            {
                "policy": policy,
                "requests": n,
                "us_per_decision": statistics.median(g[0] for g in got),
                "us_per_decision_runs": [g[0] for g in got],
                "us_per_step": statistics.median(g[1] for g in got),
                "decisions": got[0][2],
            }
        )
        print(rows[-1], flush=True)
    if args.json:
        write_record(args.json, rows=rows, trace=args.trace, dropped_overlong=dropped)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
