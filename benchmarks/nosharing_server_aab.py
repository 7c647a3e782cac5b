"""no-sharing on three live servers (benchmarks/replay.md, "no-sharing"): vLLM's scheduler,
Feather's adapter with FEATHER_POLICY=off (vLLM's order, the adapter's hooks on) and Feather's
policy, each with the model in its engine core; interleaved repeats, every run's throughput,
vLLM's engine iterations over it and its engine core's CPU seconds, one JSON line each.

    python benchmarks/nosharing_server_aab.py kv-pressure 3 > out.jsonl
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from replay_ab import server_specs

from feather_sched.bench.suite import BenchSpec
from feather_sched.harness.vllm_server import process_cpu_s, served
from feather_sched.replay.client import preflight
from feather_sched.replay.runner import ReplaySpec, run_once
from feather_sched.replay.workload import replay_workloads

LABELS = ("vllm", "feather-off", "feather")


def main(scenario: str, repeats: int) -> None:
    vllm, feather = server_specs(scenario, Path.home() / ".cache" / "feather", True)
    off = dataclasses.replace(feather, env=(("FEATHER_POLICY", "off"),))
    with tempfile.TemporaryDirectory() as tmp, served([vllm, off, feather], Path(tmp)) as servers:
        endpoints = [preflight(s.url) for s in servers]
        bench = BenchSpec(workloads=("no-sharing",))
        work = replay_workloads(bench, "kv-bound", None, endpoints[0].max_model_len)[0]
        for rep in range(repeats):
            for i in [0, 1, 2] if rep % 2 == 0 else [2, 1, 0]:
                before = process_cpu_s(servers[i].pid)["engine"]
                row = run_once(endpoints[i], LABELS[i], work, ReplaySpec(LABELS))
                engine = process_cpu_s(servers[i].pid)["engine"] - before
                out = {"scenario": scenario, "rep": rep, "server": LABELS[i]}
                out.update(tok_s=row["output_tok_s"], makespan_s=row["makespan_s"])
                out.update(iterations=row.get("server_iterations"), engine_cpu_s=round(engine, 2))
                out.update(iteration_tokens=row.get("server_iteration_tokens"))
                print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
