"""Feather's KV gate on and off in the simulator: the measurement behind overload.md's table.

Runs `feather` (with the bench's own step-cost prior, as `feather bench` does) with
`kv_gate=True` and `kv_gate=False` on: the default suite on H100 and A100, multi-turn and
tree, the real kv-bound engine's paper-4g and paper-32g replayed with its calibrated CPU
profile (benchmarks/vllm/cpu-kv-bound-fitted.json) at 1,024 and 2,048 KV blocks, and a trace when
given (`--trace`, overlong requests dropped as `--drop-overlong` does). The simulator is
deterministic, so one run per cell is the result.
Usage: python benchmarks/sim/kv_gate_sim.py [--trace PATH] [--json FILE]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from feather_lab.bench.context import fit_context
from feather_lab.bench.record import write_record
from feather_lab.bench.suite import BenchSpec, build_workload
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_sched.cost import StepCostModel
from feather_sched.policies.feather import FeatherPolicy

KV_BOUND_PROFILE = str(Path(__file__).resolve().parents[1] / "vllm" / "cpu-kv-bound-fitted.json")


def _row(case: str, workload: str, requests, cost, engine, prior) -> dict:
    row: dict = {"case": case, "workload": workload}
    for gate in (False, True):
        s = simulate(requests, FeatherPolicy(kv_gate=gate, cost=prior), cost, engine).summary()
        key = "on" if gate else "off"
        row[f"tok_s_{key}"] = s["output_tok_s"]
        row[f"preemptions_{key}"] = s["preemptions"]
        row[f"preempt_max_{key}"] = s.get("preempt_max")
    row["on_over_off"] = round(row["tok_s_on"] / row["tok_s_off"], 4)
    print(row, flush=True)
    return row


def suite_rows(hardware: str, workloads: list[str]) -> list[dict]:
    spec = BenchSpec(hardware=hardware)
    cost = StepCostModel(spec.hardware, spec.model, spec.kernel)
    limit = cost.model.max_context_tokens
    rows = []
    for w in workloads:
        requests, _ = fit_context(build_workload(w).generate(spec.seed), limit, True, w)
        rows.append(_row(hardware, w, requests, cost, spec.engine_for(w), spec.feather_cost()))
    return rows


def kv_bound_rows() -> list[dict]:
    cost = StepCostModel(KV_BOUND_PROFILE, "kv-bound", "paged")
    rows = []
    for w in ("paper-4g", "paper-32g"):
        requests = build_workload(w, "kv-bound").generate(0)
        for blocks in (1024, 2048):
            engine = EngineConfig(block_size=32, num_kv_blocks=blocks, max_num_batched_tokens=8192)
            rows.append(_row(f"kv-bound, {blocks} blocks", w, requests, cost, engine, cost))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", help="also a trace (JSONL), on the H100 default profile")
    parser.add_argument("--json", default="benchmarks/sim/kv-gate-sim.json")
    args = parser.parse_args()
    suite = list(BenchSpec.workloads)
    rows = suite_rows("h100", suite) + suite_rows("a100", suite)
    rows += suite_rows("h100", ["multi-turn", "tree"]) + kv_bound_rows()
    if args.trace:
        rows += suite_rows("h100", [f"trace:{args.trace}"])
    write_record(args.json, config={"trace": args.trace}, rows=rows)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
