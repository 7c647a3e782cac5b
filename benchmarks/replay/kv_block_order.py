"""Does the order of vLLM's free KV blocks move a run's step times (benchmarks/replay/README.md,
"no-sharing after paper-32g")? A server's previous run leaves its free-block queue in the order
it freed the blocks (vllm/v1/core/block_pool.py: LRU, each request's blocks reversed), so the
next run's requests get blocks scattered over the pool instead of side by side; a fresh pool
hands them out in id order. Which order the previous run leaves depends on the scheduler.

    python benchmarks/replay/kv_block_order.py --repeats 4 --json \
        OUT.json

One in-process engine (vLLM's own scheduler, `core_state.StateScheduler` logging its steps),
the kv-bound model with the kv-pressure settings of the replay A/B (1,024 blocks of 32,
8,192 batched tokens), the no-sharing workload (32 requests of 2,064 tokens, 64 out, all at
once). After one run not kept (a fresh engine's first run is slower), each run has its free
queue rebuilt first as `sequential` (block ids in order, a fresh pool's) or `shuffled` (a
random permutation, seeded by the repeat), the two alternating. Each run's throughput and step
times; `step_time` is the median over steps of shuffled / sequential step time, the two runs'
steps of the same shape paired in order (the same schedule: vLLM's order, the same requests).
Hold the machine's bench lock around it (`flock LOCKFILE python ...`).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ORDERS = ("sequential", "shuffled")


def reorder_free_blocks(sched: Any, order: str, seed: int) -> float:
    """Rebuild the (all-free) block pool's free queue in `order`; the share of its neighbours
    whose ids follow on (1.0 sequential, about 0.001 shuffled)."""
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    pool = sched.kv_cache_manager.block_pool
    free = pool.free_block_queue.get_all_free_blocks()
    if len(free) != pool.num_gpu_blocks - 1:  # the null block is never free
        raise RuntimeError(f"{pool.num_gpu_blocks - 1 - len(free)} blocks still in use")
    free.sort(key=lambda b: b.block_id)
    if order == "shuffled":
        random.Random(seed).shuffle(free)
    for b in free:
        b.prev_free_block = b.next_free_block = None
    pool.free_block_queue = FreeKVCacheBlockQueue(free)
    ids = [b.block_id for b in free]
    return sum(b - a == 1 for a, b in itertools.pairwise(ids)) / (len(ids) - 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    from feather_sched.vllm.local import CPU_THREAD_DEFAULTS

    os.environ.update(CPU_THREAD_DEFAULTS)  # before torch is imported: one OpenMP thread
    sys.path.insert(0, str(HERE))
    from core_state import STATE_ENV

    from feather_lab.bench.machine import config_provenance
    from feather_lab.bench.record import write_record
    from feather_lab.harness.vllm_engine import engine_env_defaults, model_dir
    from feather_lab.harness.vllm_run import run_once
    from feather_lab.harness.vllm_spec import VllmBenchSpec, engine_workload
    from feather_sched.vllm.local import scheduler_of

    engine_env_defaults()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    spec = VllmBenchSpec(model="kv-bound", max_num_batched_tokens=8192).resolved()
    path, dtype, vocab = model_dir(spec)
    requests = engine_workload("no-sharing", vocab, spec.seed, spec.scale)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[STATE_ENV] = str(Path(tmp) / "core.jsonl")
        llm = _engine(spec, path, dtype)
        sched = scheduler_of(llm)
        run_once(llm, requests, "warm-up")  # a fresh engine's first run is slower: not kept
        sched._snapshot("warm-up")  # zero the sums
        runs: list[dict[str, Any]] = []
        for rep in range(args.repeats):
            for order in ORDERS if rep % 2 == 0 else ORDERS[::-1]:
                llm.reset_prefix_cache()
                sequential = reorder_free_blocks(sched, order, seed=rep)
                started = time.time()
                row = run_once(llm, requests, f"{order}/{rep}")
                snap = sched._snapshot(f"{rep}:{order}")
                runs.append(_run_row(rep, order, sequential, started, row, snap))
                print(_line(runs[-1]), flush=True)
                summary = summarize(runs)
                write_record(args.json, config=_config(spec, config_provenance()), runs=runs,
                             summary=summary)  # fmt: skip
    for key, value in summary.items():
        print(key, value)
    return 0


def _engine(spec: Any, path: str, dtype: str) -> Any:
    """vLLM's own scheduler, logged by core_state.StateScheduler, in this process."""
    from vllm import LLM

    return LLM(
        path,
        dtype=dtype,
        max_model_len=spec.max_model_len,
        block_size=spec.block_size,
        num_gpu_blocks_override=1024,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=8192,
        gpu_memory_utilization=0.3,
        enforce_eager=True,
        seed=spec.seed,
        scheduler_cls="core_state.StateScheduler",
    )


def _config(spec: Any, provenance: dict[str, Any]) -> dict[str, Any]:
    return {**provenance, "model": "kv-bound", "workload": "no-sharing", "num_kv_blocks": 1024,
            "max_num_batched_tokens": 8192, "max_model_len": spec.max_model_len,
            "engine": "vllm in process, vLLM's scheduler", "orders": list(ORDERS)}  # fmt: skip


def _run_row(rep, order, sequential, started, row, snap) -> dict[str, Any]:
    keep = ("output_tok_s", "makespan_s", "busy_s", "cpu_s", "steps")
    return {"repeat": rep, "order": order, "free_queue_sequential": round(sequential, 4),
            "started": round(started, 1), **{k: row[k] for k in keep if k in row},
            "step_s": snap["step_s"], "step_median_s": snap["step_median_s"],
            "step_durations": snap["step_durations"], "step_shapes": snap["step_shapes"],
            "rusage": snap["rusage"]}  # fmt: skip


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per order: throughput by repeat and median; shuffled / sequential by repeat, in
    throughput and in paired step time (median over the steps)."""
    by = {(r["order"], r["repeat"]): r for r in runs}
    out: dict[str, Any] = {}
    for order in ORDERS:
        tputs = [r["output_tok_s"] for r in runs if r["order"] == order]
        median = round(statistics.median(tputs), 2) if tputs else None
        out[order] = {"tok_s": tputs, "median": median}
    reps = sorted({r["repeat"] for r in runs if ("shuffled", r["repeat"]) in by
                   and ("sequential", r["repeat"]) in by})  # fmt: skip
    pairs = [(by[("sequential", k)], by[("shuffled", k)]) for k in reps]
    tput = [s["output_tok_s"] / q["output_tok_s"] for q, s in pairs]
    steps = [_paired(q, s) for q, s in pairs]
    out["shuffled_vs_sequential"] = {
        "tok_s_per_repeat": [round(x, 3) for x in tput],
        "tok_s_median": round(statistics.median(tput), 3) if tput else None,
        "step_time_per_repeat": [round(x, 3) for x in steps],
        "step_time_median": round(statistics.median(steps), 3) if steps else None,
    }
    return out


def _paired(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Median over steps of b's time over a's, steps of the same shape paired in order."""
    pairs = [(x, y) for x, y, sx, sy in zip(a["step_durations"], b["step_durations"],
             a["step_shapes"], b["step_shapes"]) if sx == sy and x > 0]  # fmt: skip
    return statistics.median(y / x for x, y in pairs)


def _line(run: dict[str, Any]) -> str:
    return (
        f"rep {run['repeat']} {run['order']:<10} (sequential share "
        f"{run['free_queue_sequential']}): {run['output_tok_s']} tok/s, "
        f"{len(run['step_durations'])} steps, median {run['step_median_s']} s"
    )


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    raise SystemExit(main())
