"""Where feather's loss in the simulator's synchronous queue-length sweep comes from.

`queue_sweep.py --sync` put feather at 0.989x fcfs at 10,000 waiting. This splits it, on the
same traffic and engine (measured H200 profile + Llama-3.1-8B, vLLM V1 defaults, the
scheduler's CPU added to each step): the scheduler CPU model on (`model`) and off (`off`);
feather as it is and with its GroupingJudge forced to the engine's order (`grouping_pays`
patched to False: with no exploratory STOP on a synchronous host, feather then admits in
fcfs's order); two shuffles (seeds) of the queue; every output 128 tokens (SGLang's
generated-shared-prefix shape, as the sweep) and outputs drawn uniformly from 64-192 (same
mean), where a burst's requests no longer all finish together. Each row also says how many
of the run's steps carried prefill and how many prefill tokens such a step carried: with
equal outputs the run settles into a cycle whose shape the first wave's admissions set.

Deterministic (simulated). Usage:
    python benchmarks/scheduler-cpu/sync_loss_split.py [--sizes 128,1000,10000] [--seeds 0,1] \
        [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import queue_sweep as Q

from feather_lab.bench.record import write_record
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_sched.cost import StepCostModel
from feather_sched.policies.order import GroupingJudge
from feather_sched.policies.registry import make_policy

ROWS = ("fcfs", "feather", "feather-engine-order")
OUTPUTS = {"fixed": None, "jittered": (64, 192)}


def traffic(n: int, seed: int, outputs: tuple[int, int] | None) -> list:
    """queue_sweep.py's traffic with queue shuffle `seed`; outputs drawn in `outputs`."""
    reqs = Q.traffic(n, seed)
    if outputs is None:
        return reqs
    rng = np.random.default_rng(1000 + seed)
    lo, hi = outputs
    return [dataclasses.replace(r, output_len=int(rng.integers(lo, hi + 1))) for r in reqs]


def run(row: str, reqs: list, cpu: str, cost: StepCostModel) -> dict:
    """One simulated run of `row`; the figures the split needs."""
    policy = row.split("-")[0]
    options = {"hardware": Q.HARDWARE, "model": Q.MODEL} if policy == "feather" else {}
    engine = EngineConfig(scheduler_cpu=cpu, async_scheduling=False)
    forced = mock.patch.object(GroupingJudge, "grouping_pays", lambda self, view: False)
    with forced if row.endswith("engine-order") else contextlib.nullcontext():
        result = simulate(reqs, make_policy(policy, **options), cost, engine)
    summary, prefill = result.summary(), result.steps["prefill_tokens"]
    seconds, carries = result.steps["duration"], prefill > 0
    return {
        "output_tok_s": summary["output_tok_s"],
        "ttft_p99_s": summary["ttft_p99_s"],
        "steps": len(prefill),
        "prefill_steps": int((prefill > 0).sum()),
        "prefill_tokens_per_prefill_step": round(float(prefill[carries].mean()), 1),
        "prefill_steps_s": round(float(seconds[carries].sum()), 3),
        "decode_only_step_ms": round(float(seconds[~carries].mean()) * 1e3, 3)
        if (~carries).any()
        else None,
        "mean_prefix_groups": summary["mean_prefix_groups"],
        "sched_cpu_ms_per_step": summary.get("sched_cpu_ms_per_step"),
    }


def cell(n: int, seed: int, outputs: str, cpu: str, cost: StepCostModel) -> list[dict]:
    """Every row on one traffic, with its ratios to fcfs's."""
    reqs = traffic(n, seed, OUTPUTS[outputs])
    rows = [{"row": r, **run(r, reqs, cpu, cost)} for r in ROWS]
    base = rows[0]
    for r in rows:
        r.update(waiting=n, seed=seed, outputs=outputs, scheduler_cpu=cpu)
        r["x_fcfs"] = round(r["output_tok_s"] / base["output_tok_s"], 4)
        r["ttft_p99_x_fcfs"] = round(r["ttft_p99_s"] / base["ttft_p99_s"], 3)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128,1000,10000")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cost, rows = StepCostModel(Q.HARDWARE, Q.MODEL), []
    for n in map(int, args.sizes.split(",")):
        for seed in map(int, args.seeds.split(",")):
            for outputs in OUTPUTS:
                for cpu in ("model", "off"):
                    for r in cell(n, seed, outputs, cpu, cost):
                        rows.append(r)
                        print(
                            f"{n:>6} seed {seed} {outputs:8s} cpu {cpu:5s} {r['row']:21s} "
                            f"{r['x_fcfs']:.4f}x fcfs  p99 {r['ttft_p99_x_fcfs']:.2f}x  "
                            f"prefill steps {r['prefill_steps']} of {r['steps']} "
                            f"({r['prefill_tokens_per_prefill_step']:.0f} tok)",
                            flush=True,
                        )
    if args.json:
        write_record(
            args.json,
            benchmark=__doc__.splitlines()[0],
            command="python benchmarks/scheduler-cpu/sync_loss_split.py " + " ".join(sys.argv[1:]),
            hardware_provenance=cost.hardware.provenance_note,
            rows=rows,
        )
    return 0


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    sys.exit(main())
