"""The fitted model against the real engine end to end: the simulator on the bench workloads
with the fitted profile, and the model on each real run's own steps."""

from __future__ import annotations

from typing import Any

from feather_lab.harness.vllm_spec import BASELINE, VllmBenchSpec, engine_workload
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_sched.cost import HardwareProfile, ModelProfile, StepCostModel


def replayed(
    rows: list[dict[str, Any]], profile: HardwareProfile, model: ModelProfile
) -> list[dict[str, Any]]:
    """The real rows with `replay_pred_s`: the fitted model's time for each run's own steps."""
    cost = StepCostModel(profile, model)
    out = []
    for row in rows:
        shapes = row.pop("step_shapes", None) or []
        out.append({**row, "replay_pred_s": round(sum(map(cost.step_time, shapes)), 4)})
    return out


def compare_end_to_end(
    profile: HardwareProfile,
    model,
    bench_spec: VllmBenchSpec,
    rows: list[dict[str, Any]],
    vocab: int,
) -> list[dict[str, Any]]:
    """Simulated vs real output tokens/s for each real row (vllm <-> the sim's fcfs)."""
    from feather_sched.policies.registry import make_policy

    cost = StepCostModel(profile, model)
    out = []
    for row in rows:
        scenario = row.get("scenario")
        wname = row["workload"].split(" (")[0]
        if scenario is None or wname not in bench_spec.workloads:
            continue
        config = EngineConfig(
            max_num_seqs=bench_spec.max_num_seqs,
            max_num_batched_tokens=bench_spec.max_num_batched_tokens,
            block_size=bench_spec.block_size,
            num_kv_blocks=int(row["kv_blocks"]),
            index_chunk_size=bench_spec.block_size,
        )
        requests = engine_workload(wname, vocab, bench_spec.seed, bench_spec.scale)
        policy = "fcfs" if row["policy"] == BASELINE else row["policy"]
        options = bench_spec.policy_options.get(policy, {})
        sim = simulate(requests, make_policy(policy, **options), cost, config).summary()
        real = float(row["output_tok_s"])
        out.append(
            {
                "workload": row["workload"],
                "policy": row["policy"],
                "real_tok_s": real,
                "sim_tok_s": sim["output_tok_s"],
                "sim_over_real": round(sim["output_tok_s"] / real, 3) if real else None,
                "real_mean_batch": row.get("mean_batch"),
                "sim_mean_batch": sim["mean_batch"],
                "real_steps": row.get("steps"),
                "sim_steps": sim["steps"],
                # The step model on the real run's own steps vs their measured time: the
                # cost model's share of the end-to-end error (the rest is scheduling).
                "replay_over_busy": round(row["replay_pred_s"] / row["busy_s"], 3)
                if row.get("replay_pred_s") and row.get("busy_s")
                else None,
            }
        )
    return out
