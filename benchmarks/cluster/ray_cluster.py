"""A real Ray Serve run of the cluster bench, beside the simulator's prediction of it.

A local Ray Serve app of N `EmulatedEngine` replicas (each the simulator's engine played out in
wall-clock time from the H100 cost model: no GPU, no weights) behind each router: Ray's
default pow2 and Ray Serve LLM's `PrefixCacheAffinityRouter` (both over FCFS replicas), and
`FeatherRequestRouter` (over Feather replicas). The workload is sent through a
`DeploymentHandle` at its arrival times; each request carries its token ids and, for Ray's
prefix router (which reads text), the same prompt as text (one character per token, as the
simulator's port reads it). Then `sim.cluster` simulates the same requests, routers and
replica policies: the prediction.

    python benchmarks/cluster/ray_cluster.py --replicas 4 --workload paper-20g-400

Writes benchmarks/cluster/ray-cluster.json (the machine, each router's real and simulated row).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import numpy as np
import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from feather_lab.bench.record import write_record
from feather_lab.bench.suite import BenchSpec
from feather_lab.harness.ray_emulated import EmulatedEngine
from feather_lab.sim.cluster import simulate_cluster
from feather_lab.sim.config import EngineConfig
from feather_lab.workloads.presets import build_workload, paper
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.registry import make_policy
from feather_sched.ray.router import CompletionRequest, FeatherRequestRouter
from feather_sched.routing.prefix_tree import tokens_to_text
from feather_sched.routing.rules import REPLICA_POLICY, make_rule

RAY_PREFIX_ROUTER = (
    "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:"
    "PrefixCacheAffinityRouter"
)
ROUTER_CONFIG = {
    "pow2": None,
    "prefix-affinity": RequestRouterConfig(request_router_class=RAY_PREFIX_ROUTER),
    "feather": RequestRouterConfig(request_router_class=FeatherRequestRouter),
}


def workload(name: str):
    if name == "paper-20g-400":  # the paper's 20-group scenario at 400 requests
        return paper(20, 400).build().generate(0), {"max_num_seqs": 500}
    return build_workload(name).generate(0), {}


async def drive(handle, reqs) -> tuple[list[dict], float]:
    t0 = time.monotonic()
    tasks = []

    async def one(r, payload):
        sent = time.monotonic()
        out = await handle.remote(payload)
        out["sent"] = sent - t0
        out["done"] = time.monotonic() - t0
        return out

    for r in reqs:
        delay = r.arrival_time - (time.monotonic() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        ids = r.prompt.tolist()
        payload = CompletionRequest(
            r.request_id,
            prompt=tokens_to_text(r.prompt),
            max_tokens=r.output_len,
            prompt_token_ids=ids,
        )
        tasks.append(asyncio.ensure_future(one(r, payload)))
    return await asyncio.gather(*tasks), t0


def real_row(router: str, answers: list[dict], n: int) -> dict:
    out = sum(a["output_tokens"] for a in answers)
    span = max(a["done"] for a in answers) - min(a["sent"] for a in answers)
    per: dict[str, int] = {}
    for a in answers:
        per[a["replica"]] = per.get(a["replica"], 0) + 1
    counts = list(per.values()) + [0] * (n - len(per))
    ttft = [a["ttft_s"] for a in answers]
    return {
        "router": router,
        "policy": REPLICA_POLICY[router],
        "replicas": n,
        "requests": len(answers),
        "output_tok_s": round(out / span, 2),
        "ttft_p50_s": round(float(np.percentile(ttft, 50)), 4),
        "ttft_p99_s": round(float(np.percentile(ttft, 99)), 4),
        "load_imbalance": round(max(counts) / (sum(counts) / n), 3),
        "requests_per_replica": sorted(counts, reverse=True),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--workload", default="paper-20g-400")
    ap.add_argument("--routers", default="pow2,prefix-affinity,feather")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/cluster/ray-cluster.json"))
    args = ap.parse_args()
    reqs, engine = workload(args.workload)
    spec = BenchSpec()
    cost = StepCostModel(spec.hardware, spec.model, spec.kernel)
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    rows = []
    for router in args.routers.split(","):
        policy = REPLICA_POLICY[router]
        # names, not a cost model: a deployment's options reach its replicas as text
        # (`make_policy` there turns them into feather's prior, the bench's own profiles)
        names = {"hardware": spec.hardware, "model": spec.model, "kernel": spec.kernel}
        popts = names if policy == "feather" else {}
        opts = {
            "name": router,
            "num_replicas": args.replicas,
            "max_ongoing_requests": 100_000,
            "ray_actor_options": {"num_cpus": 0},
        }
        if ROUTER_CONFIG[router] is not None:
            opts["request_router_config"] = ROUTER_CONFIG[router]
        dep = serve.deployment(EmulatedEngine).options(**opts)
        handle = serve.run(
            dep.bind(policy=policy, engine=engine, policy_options=popts),
            name=router,
            route_prefix=None,
        )
        answers, _ = asyncio.run(drive(handle, reqs))
        real = real_row(router, answers, args.replicas)
        serve.delete(router)
        sim = simulate_cluster(
            reqs,
            make_rule(router),
            lambda policy=policy, popts=popts: make_policy(policy, **popts),
            cost,
            EngineConfig(**engine),
            args.replicas,
        ).summary()
        keys = ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "load_imbalance")
        row = {
            "workload": args.workload,
            **real,
            "sim": {k: sim[k] for k in (*keys, "requests_per_replica", "mean_prefix_groups")},
        }
        print(row, flush=True)
        rows.append(row)
    write_record(args.json, config=vars(args) | {"json": str(args.json)}, rows=rows)
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
