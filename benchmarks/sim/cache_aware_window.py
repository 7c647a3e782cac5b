"""Sweep of vllm-cache-aware's window on the default bench suite (`feather bench`'s workloads,
hardware and engine settings): output tokens/s per window, each against fcfs.

vLLM 0.34 names no window ("prefer the smallest window that spans the usual queue depth"),
so the policy's default (`vllm_cache_aware.DEFAULT_WINDOW`) is read off this sweep.

Usage: PYTHONPATH=src python benchmarks/sim/cache_aware_window.py OUT.json [--windows 16,64,...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from feather_lab.bench.record import write_record
from feather_lab.bench.suite import BenchSpec, prepare_workloads
from feather_lab.sim.engine import simulate
from feather_sched.policies.registry import make_policy

WINDOWS = (16, 64, 256, 1024, 4096)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--windows", default=",".join(map(str, WINDOWS)))
    args = parser.parse_args(argv)
    try:
        windows = [int(w) for w in args.windows.split(",")]
        if any(w < 1 for w in windows):
            raise ValueError
    except ValueError:
        print(f"--windows: integers >= 1 separated by commas, got {args.windows!r}")
        return 2
    spec = BenchSpec(policies=("fcfs", "vllm-cache-aware"))
    cost = spec.costs().run
    rows = []
    for name, prepared in prepare_workloads(spec, cost).items():
        engine = spec.engine_for(prepared.base or name)
        runs = [("fcfs", make_policy("fcfs"))] + [
            (f"window={w}", make_policy("vllm-cache-aware", window=w)) for w in windows
        ]
        base = None
        for label, policy in runs:
            tok_s = simulate(prepared.requests, policy, cost, engine).summary()["output_tok_s"]
            base = base or tok_s
            rows.append({"workload": name, "run": label, "output_tok_s": tok_s})
            print(f"{name:<22} {label:<12} {tok_s:10.1f} tok/s  {tok_s / base:.3f}x fcfs")
    write_record(args.out, hardware=spec.hardware, rows=rows)
    return 0


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    sys.exit(main(sys.argv[1:]))
