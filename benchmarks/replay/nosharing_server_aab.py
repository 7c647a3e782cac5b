"""no-sharing on several live servers at once (benchmarks/replay/README.md, "no-sharing"): any
mix of
vLLM's scheduler (`vllm`), Feather's adapter with FEATHER_POLICY=off (`feather-off`: vLLM's
order, the adapter's hooks on) and Feather's policy (`feather`), each with the model in its
engine core; interleaved repeats, every run's throughput, vLLM's engine iterations over it,
its engine core's CPU seconds and minor page faults, the machine's steal time, one JSON line
each. A label given twice starts two servers of that kind: an A/A pair says how far two
servers of the same code drift apart on one machine.

    python benchmarks/replay/nosharing_server_aab.py kv-pressure 3 > out.jsonl
    python benchmarks/replay/nosharing_server_aab.py kv-pressure 4 --servers \
        vllm,vllm,feather,feather \
        --warm paper-32g > out.jsonl

`--warm WORKLOAD` runs that workload once on every server first (its lines carry `"warm":
true`), as the A/B's no-sharing runs follow paper-32g on the same servers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from pathlib import Path

from replay_ab import server_specs

from feather_lab.bench.suite import BenchSpec
from feather_lab.harness.vllm_server import (
    ServerSpec,
    proc_stat,
    process_cpu_s,
    process_levels,
    served,
)
from feather_lab.replay.client import preflight
from feather_lab.replay.runner import ReplaySpec, run_once
from feather_lab.replay.workload import replay_workloads

KINDS = ("vllm", "feather-off", "feather")


def _specs(scenario: str, labels: list[str]) -> list[ServerSpec]:
    vllm, feather = server_specs(scenario, Path.home() / ".cache" / "feather", True)
    off = dataclasses.replace(feather, env=(("FEATHER_POLICY", "off"),))
    return [dict(zip(KINDS, (vllm, off, feather)))[label] for label in labels]


def _faults(pid: int) -> int:
    """Minor page faults so far of the engine core (and anything below it) of server `pid`."""
    total = 0
    for level in process_levels(pid)[1:]:
        for proc in level:
            try:
                total += int(proc_stat(proc)[7])  # minflt
            except OSError:
                continue
    return total


def _steal_s() -> float:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return int(fields[7]) / os.sysconf("SC_CLK_TCK")


def _run(endpoint, server, label: str, work) -> dict:
    before = (process_cpu_s(server.pid)["engine"], _faults(server.pid), _steal_s())
    row = run_once(endpoint, label, work, ReplaySpec((label,)))
    after = (process_cpu_s(server.pid)["engine"], _faults(server.pid), _steal_s())
    out = {"tok_s": row["output_tok_s"], "makespan_s": row["makespan_s"]}
    out.update(iterations=row.get("server_iterations"), finished=row["finished"])
    out.update(engine_cpu_s=round(after[0] - before[0], 2), engine_minflt=after[1] - before[1])
    out.update(steal_s=round(after[2] - before[2], 2))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=("kv-pressure", "no-pressure"))
    parser.add_argument("repeats", type=int)
    parser.add_argument("--servers", default=",".join(KINDS), help=f"labels from {KINDS}")
    parser.add_argument("--warm", default=None, help="a workload run once on each server first")
    args = parser.parse_args(argv)
    labels = args.servers.split(",")
    if bad := [label for label in labels if label not in KINDS]:
        parser.error(f"--servers: unknown {bad}; valid: {', '.join(KINDS)}")
    names = [f"{label}-{labels[:i].count(label)}" for i, label in enumerate(labels)]
    specs = _specs(args.scenario, labels)
    with tempfile.TemporaryDirectory() as tmp, served(specs, Path(tmp)) as servers:
        endpoints = [preflight(s.url) for s in servers]
        bench = BenchSpec(workloads=tuple(w for w in ("no-sharing", args.warm) if w))
        made = replay_workloads(bench, "kv-bound", None, endpoints[0].max_model_len)
        works = dict(zip(bench.workloads, made))
        order = list(range(len(servers)))
        plan = [(args.warm, -1, order)] if args.warm else []
        for rep in range(args.repeats):
            plan.append(("no-sharing", rep, order[rep % len(order) :] + order[: rep % len(order)]))
        for workload, rep, turn in plan:
            for i in turn:
                out = {"scenario": args.scenario, "rep": rep, "server": names[i]}
                out.update(workload=workload, warm=rep < 0)
                out.update(_run(endpoints[i], servers[i], labels[i], works[workload]))
                print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
