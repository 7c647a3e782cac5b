"""The queue-length sweep in the simulator: shared-prefix traffic at 128, 1,000
and 10,000 waiting, with the scheduler's CPU on the clock (`--scheduler-cpu model`) and off.

Traffic: SGLang's generated-shared-prefix shape at the scale of `feather sglang-bench`'s
record (64 system prompts of 1,500 tokens, 500-token questions, 128 output tokens),
shuffled, every request arriving at t=0, so the queue holds all N at the first pass. Engine:
the measured H200 profile (`h200`, benchmarks/gpu/README.md) + Llama-3.1-8B, vLLM V1 defaults,
the scheduler CPU hidden under the step up to its length (async scheduling / overlap loop;
`--sync`: added to it, a synchronous loop).
Deterministic: one run per cell (`model` charges modelled seconds, not timed ones).

Usage: python benchmarks/scheduler-cpu/queue_sweep.py [--sizes 128,1000,10000] [--policies ...]
           [--json benchmarks/scheduler-cpu/sim.json] [--plot benchmarks/scheduler-cpu/sim.png]
"""

from __future__ import annotations

import argparse
import time

from feather_lab.bench.record import write_record
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.sim.scheduler_cpu import load_scheduler_cpu
from feather_lab.workloads.registry import make_workload
from feather_sched.cost import StepCostModel
from feather_sched.policies.registry import make_policy

HARDWARE = "h200"
MODEL = "llama-3.1-8b"
POLICIES = "fcfs,lpm,dfs-weight,hrrn,feather,max-homogeneous"
SHAPE = {"num_groups": 64, "system_prompt_len": 1500, "question_len": 500, "output_len": 128}
KEEP = (
    "output_tok_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "mean_batch",
    "mean_prefix_groups",
    "mean_step_ms",
    "prefix_hit_rate",
    "preemptions",
    "sched_cpu_share",
    "sched_cpu_ms_per_step",
    "sched_cpu_bound_steps",
)


def traffic(n: int, seed: int = 0) -> list:
    """`n` shared-prefix requests, all waiting at t=0 (the first n of the groups shuffled by
    `seed`)."""
    per_group = -(-n // SHAPE["num_groups"])
    workload = make_workload("shared-prefix", prompts_per_group=per_group, **SHAPE)
    return workload.generate(seed)[:n]


def run_cell(n: int, policy: str, mode: str, cost: StepCostModel, sync: bool = False) -> dict:
    options = {"hardware": HARDWARE, "model": MODEL} if policy.startswith("feather") else {}
    engine = EngineConfig(scheduler_cpu=mode, async_scheduling=not sync)
    t0 = time.perf_counter()
    summary = simulate(traffic(n), make_policy(policy, **options), cost, engine).summary()
    row = {"waiting": n, "policy": policy, "scheduler_cpu": mode}
    row.update({k: summary.get(k) for k in KEEP})
    row["sim_wall_s"] = round(time.perf_counter() - t0, 1)
    return row


def add_ratios(rows: list[dict]) -> None:
    """Each row's throughput over fcfs's and over the best of its (size, mode) cell."""
    for r in rows:
        same = [
            x
            for x in rows
            if (x["waiting"], x["scheduler_cpu"]) == (r["waiting"], r["scheduler_cpu"])
        ]
        fcfs = next(x["output_tok_s"] for x in same if x["policy"] == "fcfs")
        best = max(x["output_tok_s"] for x in same if x["policy"] != "max-homogeneous")
        r["vs_fcfs"] = round(r["output_tok_s"] / fcfs, 4)
        r["vs_best"] = round(r["output_tok_s"] / best, 4)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, mode in zip(axes, ("model", "off")):
        for policy in dict.fromkeys(r["policy"] for r in rows):
            pts = [(r["waiting"], r["output_tok_s"]) for r in rows
                   if r["policy"] == policy and r["scheduler_cpu"] == mode]  # fmt: skip
            if pts:
                ax.plot(*zip(*sorted(pts)), marker="o", label=policy)
        ax.set_xscale("log")
        ax.set_xlabel("requests waiting at t=0")
        ax.set_title(f"scheduler CPU {mode}" + (" (on the clock)" if mode == "model" else ""))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("output tokens/s (simulated)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Queue-length sweep, simulated: {HARDWARE} (measured) + {MODEL}, shared prefix")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _args_text(args: argparse.Namespace) -> list[str]:
    """The command line that repeats this run (a flag as itself, only when set)."""
    return [
        f"--{k}" if v is True else f"--{k} {v}"
        for k, v in vars(args).items()
        if v is not False and v is not None
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128,1000,10000")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--modes", default="model,off")
    ap.add_argument("--sync", action="store_true", help="a synchronous loop: gpu + cpu")
    ap.add_argument("--json", default="benchmarks/scheduler-cpu/sim.json")
    ap.add_argument("--plot", default="benchmarks/scheduler-cpu/sim.png")
    args = ap.parse_args()
    cost = StepCostModel(HARDWARE, MODEL)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        for mode in args.modes.split(","):
            for policy in args.policies.split(","):
                rows.append(run_cell(n, policy, mode, cost, args.sync))
                print(rows[-1], flush=True)
    add_ratios(rows)
    write_record(
        args.json,
        command=" ".join(["python benchmarks/scheduler-cpu/queue_sweep.py", *_args_text(args)]),
        hardware=HARDWARE,
        hardware_provenance=cost.hardware.provenance_note,
        model=MODEL,
        shape=SHAPE,
        scheduler_cpu_model=load_scheduler_cpu().provenance,
        scheduler_cpu_rule="gpu + cpu (a synchronous loop)"
        if args.sync
        else "max(gpu, cpu) (async scheduling / overlap loop)",
        rows=rows,
    )
    plot(rows, args.plot)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
