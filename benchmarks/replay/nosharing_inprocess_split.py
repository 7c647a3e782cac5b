"""no-sharing in process (benchmarks/replay/README.md, "no-sharing"): vLLM's engine and Feather's
(its policy `feather`, then `fcfs`: the adapter's hooks with vLLM's order), interleaved
rounds; per run the throughput, the steps, and the seconds spent in the model
(`execute_model` + `sample_tokens`), `schedule` and `update_from_output`, one JSON line each.

    python benchmarks/replay/nosharing_inprocess_split.py no-pressure 3 > out.jsonl
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict

from replay_ab import PRIOR

from feather_lab.cli.bench import feather_prior_options
from feather_lab.harness import vllm_engine as ve
from feather_lab.harness.vllm_run import run_once
from feather_lab.harness.vllm_spec import ENGINE_SCALES, VllmBenchSpec, engine_workload
from feather_lab.harness.vllm_suite import open_engines

TIMED = {"model_executor": ("execute_model", "sample_tokens"),
         "scheduler": ("schedule", "update_from_output")}  # fmt: skip


def timed(core, acc: dict[str, float]) -> None:
    """Wrap the engine core's model and scheduler calls to add their wall time to `acc`."""
    for owner, names in TIMED.items():
        obj = getattr(core, owner)
        for name in names:

            def wrapper(*a, _f=getattr(obj, name), _k=name, **k):
                t = time.perf_counter()
                try:
                    return _f(*a, **k)
                finally:
                    acc[_k] += time.perf_counter() - t

            setattr(obj, name, wrapper)


def main(scenario_name: str, rounds: int) -> None:
    scenario = next(s for s in ENGINE_SCALES["kv-bound"].scenarios if s.name == scenario_name)
    options = feather_prior_options(str(PRIOR), "kv-bound")
    spec = VllmBenchSpec(workloads=["no-sharing"], policies=["feather"], model="kv-bound",
                         scenarios=[scenario], max_num_batched_tokens=8192,
                         policy_options=options).resolved()  # fmt: skip
    ve.engine_env_defaults()
    acc: dict[str, float] = defaultdict(float)
    with ve.scoped_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"):
        path, _dtype, vocab = ve.model_dir(spec)
        requests = engine_workload("no-sharing", vocab, spec.seed, spec.scale)
        engines = open_engines(spec, scenario, path, _dtype, vocab)
        for llm in engines.values():
            timed(llm.llm_engine.engine_core.engine_core, acc)
        runs = [("vllm", None), ("feather", "feather"), ("feather", "fcfs")]
        for r in range(rounds):
            for engine, policy in runs if r % 2 == 0 else runs[::-1]:
                if policy is not None:
                    ve.set_policy(engines[engine], policy, options.get(policy, {}))
                acc.clear()
                row = run_once(engines[engine], requests, "split")
                label = engine if policy is None else f"feather-adapter/{policy}"
                out = {"scenario": scenario_name, "round": r, "run": label}
                out.update(tok_s=row["output_tok_s"], steps=row["steps"], busy_s=row["busy_s"])
                out.update({f"{k}_s": round(v, 3) for k, v in acc.items()})
                print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
