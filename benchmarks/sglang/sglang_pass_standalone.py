"""Feather's part of an SGLang batch formation, without SGLang (the SGLang CPU bar).

`feather sglang-bench` measures Feather's added CPU inside SGLang's own classes, but its
figure is the difference of two ~4.5 ms formations and spreads ~+-0.1 ms run to run on the
dev VM, a quarter of the bar. This drives the same `SGLangQueue` calls the adder subclass
makes (`begin_pass`, then `before_offer` / `after_offer` for each request SGLang's loop
offers, harness/sglang_loop.py) over stand-in requests, with nothing else on the clock, so
a change to Feather's own code shows at a few microseconds. Workload as the bench's: N
waiting requests of 2,000 tokens, each one of 100 shared 1,500-token prefixes (SGLang's
radix cache holds them: `prefix_len` 1,500) plus a private suffix; the adder takes 17 (what
SGLang's adder admits there). Wall time on `perf_counter` (this thread does nothing else);
median and quartiles over `--repeats` fresh queues, policies interleaved.

Usage: python benchmarks/sglang/sglang_pass_standalone.py [--policies fcfs,grouped] [--waiting 1000]
           [--repeats 200] [--json OUT.json]

(Compare codes by running it with PYTHONPATH set to each checkout's src, interleaved.)
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from types import SimpleNamespace

from feather_lab.bench.record import write_record
from feather_lab.harness.sglang_bench import PREFIX_LEN, prefix_pool, prompt
from feather_lab.harness.sglang_loop import StandInReq, scheduler_loop
from feather_sched.policies.registry import make_policy
from feather_sched.sglang.queue import SGLangQueue

ADMITTED = 17
"""Requests SGLang's adder admits in `feather sglang-bench`'s formation at this workload."""


def requests(n: int, seed: int = 0) -> list[StandInReq]:
    """`feather sglang-bench`'s workload (harness/sglang_bench.py), as stand-in requests whose
    radix match covers their shared prefix."""
    rng = random.Random(seed)
    prefixes = prefix_pool(rng)
    params = SimpleNamespace(max_new_tokens=128)
    return [
        StandInReq(
            rid=f"r{i}",
            origin_input_ids=prompt(rng, prefixes),
            sampling_params=params,
            prefix_len=PREFIX_LEN,
        )
        for i in range(n)
    ]


def formation(reqs: list[StandInReq], policy: str) -> float:
    """Milliseconds of Feather's calls in one formation over a fresh queue holding `reqs`."""
    tree = SimpleNamespace(disable=False, page_size=1)  # a radix cache that is on
    q = SGLangQueue(make_policy(policy), chunk_tokens=64, tree_cache=tree)
    waiting = list(reqs)
    q.sync(waiting, [])  # arrivals were hashed before the formation, as in a server
    gc.collect()
    t0 = time.perf_counter()
    q.begin_pass(waiting, [])
    scheduler_loop(q, waiting, ADMITTED)
    elapsed = (time.perf_counter() - t0) * 1e3
    if q.stats.admitted != ADMITTED:
        raise RuntimeError(f"{policy}: {q.stats.admitted} admitted, expected {ADMITTED}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="fcfs,grouped")
    ap.add_argument("--waiting", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.waiting <= ADMITTED or args.repeats < 4:
        ap.error(f"--waiting must be > {ADMITTED} and --repeats >= 4")
    policies = args.policies.split(",")
    reqs = requests(args.waiting)
    times: dict[str, list[float]] = {p: [] for p in policies}
    for _ in range(args.repeats):
        for p in policies:
            times[p].append(formation(reqs, p))
    rows = []
    for p, ts in times.items():
        q1, med, q3 = statistics.quantiles(ts, n=4)
        rows.append({"policy": p, "median_ms": med, "q1_ms": q1, "q3_ms": q3})
        print(f"{p}: median {med:.4f} ms (q1 {q1:.4f}, q3 {q3:.4f})", flush=True)
    if args.json:
        write_record(
            args.json,
            benchmark="Feather's part of an SGLang formation, without SGLang",
            command="python benchmarks/sglang/sglang_pass_standalone.py " + " ".join(sys.argv[1:]),
            waiting=args.waiting,
            admitted=ADMITTED,
            repeats=args.repeats,
            rows=rows,
        )
    return 0


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    sys.exit(main())
