"""Feather's hold bound in the simulator: throughput and the TTFT tail against FCFS.

The real kv-bound engine's workloads (paper-4g, paper-32g, no-sharing at its scale) under its
KV pressure (1,024 blocks of 32 tokens, 8,192 batched tokens, 256 sequences), replayed with
its calibrated CPU profile (benchmarks/vllm/cpu-kv-bound-fitted.json, also Feather's prior, as
`feather bench --engine vllm --feather-hardware` gives it), all at once and as a Poisson
stream of 20 requests/s. `feather` at each `max_hold_steps` (None: unbounded, `feather-hold`)
against FCFS, the engine's order; `--reference` adds other policies' rows beside them (the
authors' `feather-paper` and `feather-upstream`: where the hold bound's frontier stands against
them, benchmarks/paper-policies/README.md). Deterministic: one run per cell.
Usage: python benchmarks/feather/hold_bound.py OUT.json [--holds none,4,8,16] [--reference P,Q]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from feather_lab.bench.record import write_record
from feather_lab.harness.vllm_spec import engine_scale, engine_workload
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_sched.cost import StepCostModel, load_hardware, load_model
from feather_sched.policies.base import Policy
from feather_sched.policies.fcfs import FCFSPolicy
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.registry import make_policy

PROFILE = str(Path(__file__).resolve().parents[1] / "vllm" / "cpu-kv-bound-fitted.json")
ENGINE = EngineConfig(
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    block_size=32,
    num_kv_blocks=1024,
    index_chunk_size=32,
)


def _requests(workload: str, rate: float | None) -> list:
    arrival = None if rate is None else f"poisson:{rate:g}"
    return engine_workload(workload, 512, 0, engine_scale("kv-bound"), arrival)


Run = tuple[dict, Policy]
"""A row's labels (what sets it apart) and the policy that runs it."""


def sweep(runs: Callable[[StepCostModel], list[Run]]) -> list[dict]:
    """Every workload and arrival of the rows above, each run against FCFS; `runs` builds the
    policies from the profile's cost model (hold_clock.py sweeps its own)."""
    cost = StepCostModel(load_hardware(PROFILE), load_model("kv-bound"))
    rows = []
    for workload in ("paper-4g", "paper-32g", "no-sharing"):
        for rate in (None, 20.0):
            reqs = _requests(workload, rate)
            fcfs = simulate(reqs, FCFSPolicy(), cost, ENGINE).summary()
            for labels, policy in runs(cost):
                s = simulate(reqs, policy, cost, ENGINE).summary()
                row = {
                    "workload": workload,
                    "arrival": "all-at-once" if rate is None else f"poisson:{rate:g}",
                    **labels,
                    "tok_s": s["output_tok_s"],
                    "fcfs_tok_s": fcfs["output_tok_s"],
                    "x_fcfs": round(s["output_tok_s"] / fcfs["output_tok_s"], 3),
                    "ttft_p99_s": s["ttft_p99_s"],
                    "fcfs_ttft_p99_s": fcfs["ttft_p99_s"],
                    "ttft_p99_x_fcfs": round(s["ttft_p99_s"] / fcfs["ttft_p99_s"], 2),
                    "preemptions": s["preemptions"],
                    "fcfs_preemptions": fcfs["preemptions"],
                    "hold_releases": s.get("hold_releases"),
                }
                print(row, flush=True)
                rows.append(row)
    return rows


def _runs(holds: list[int | None], reference: list[str]) -> Callable[[StepCostModel], list[Run]]:
    def runs(cost: StepCostModel) -> list[Run]:
        bounded = [
            (
                {"policy": "feather", "max_hold_steps": hold},
                FeatherPolicy(cost=cost, max_hold_steps=hold),
            )
            for hold in holds
        ]
        return bounded + [
            ({"policy": name, "max_hold_steps": None}, make_policy(name)) for name in reference
        ]

    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--holds", default="none,4,8,16")
    parser.add_argument("--reference", default="", help="other policies' rows, comma-separated")
    args = parser.parse_args()
    holds = [None if h == "none" else int(h) for h in args.holds.split(",")]
    reference = [name for name in args.reference.split(",") if name]
    config = {"profile": "cpu-kv-bound-fitted", "holds": holds, "reference": reference}
    write_record(args.out, config=config, rows=sweep(_runs(holds, reference)))


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
