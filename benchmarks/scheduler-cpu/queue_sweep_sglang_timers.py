"""Where the scheduler thread's CPU goes in one queue_sweep_sglang.py cell, without a profiler.

cProfile inflates SGLang's loop ~9x on this VM (per-call overhead), which hides costs that
are not extra Python calls but the same calls running slower. This runs one cell unprofiled
(as queue_sweep_sglang.py's `serve_spec` builds it, in this process) with a thread-CPU timer
around each named function (outermost call only), and records how far apart in memory the
members of each batch were created (`id()` of SGLang's `Req` objects), the loop's counters and
the CPU other processes used meanwhile. benchmarks/scheduler-cpu/README.md, "Feather's extra CPU at
10,000 waiting".

Usage: python benchmarks/scheduler-cpu/queue_sweep_sglang_timers.py N POLICY OUT.json
[module:Qual.name ...]
POLICY: a queue_sweep_sglang.py policy; `sg:NAME` SGLang's own --schedule-policy NAME (no
Feather); `fp:NAME` the Feather policy NAME through the plugin, without options.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import queue_sweep_sglang as Q

from feather_lab.harness import sglang_engine as E

TIMES: dict[str, list] = {}
SPREAD = [0, 0.0, 0.0]  # batches seen, 64 KiB regions per member, MiB spanned


def timed(owner, attr: str, label: str) -> None:
    """Replace owner.attr by a wrapper that adds its thread CPU (outermost calls) to TIMES."""
    fn = getattr(owner, attr)
    acc = TIMES.setdefault(label, [0, 0.0])
    depth = [0]

    @functools.wraps(fn)
    def wrapper(*a, **k):
        if depth[0]:
            return fn(*a, **k)
        depth[0] += 1
        c0 = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            acc[0] += 1
            acc[1] += time.thread_time() - c0
            depth[0] -= 1

    setattr(owner, attr, wrapper)


def spec_for(n: int, policy: str):
    if policy.startswith("sg:"):
        return dataclasses.replace(Q.serve_spec(n, "fcfs"), schedule_policy=policy[3:])
    if policy.startswith("fp:"):
        base = Q.serve_spec(n, "feather")
        return dataclasses.replace(base, feather_policy=policy[3:], policy_options={})
    return Q.serve_spec(n, policy)


def watch_batches(scheduler_cls) -> None:
    """Record how scattered in memory each batch's requests are (never changes a decision)."""
    orig = scheduler_cls.process_batch_result

    def process_batch_result(self, batch, result, *a, **k):
        reqs = batch.reqs
        if len(reqs) > 16:
            ids = sorted(map(id, reqs))
            SPREAD[0] += 1
            SPREAD[1] += len({i >> 16 for i in ids}) / len(ids)
            SPREAD[2] += (ids[-1] - ids[0]) / 2**20
        return orig(self, batch, result, *a, **k)

    scheduler_cls.process_batch_result = process_batch_result


def busy_ticks() -> int:
    """CPU ticks the whole machine spent busy (/proc/stat, all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = list(map(int, f.readline().split()[1:]))
    return sum(v) - v[3] - v[4]


def main(argv: list[str]) -> dict:
    n, policy, out = int(argv[0]), argv[1], argv[2]
    spec = spec_for(n, policy)
    E._plugin_env(spec)
    from feather_sched.sglang.cpu import prepare_cpu_import

    prepare_cpu_import()
    import sglang.srt.plugins as plugins
    from sglang.srt.managers import scheduler as S

    plugins.load_plugins()  # Feather's hooks first, so the timers wrap the hooked methods
    plugins.load_plugins = lambda: None  # _child_main would load them again
    for target in argv[3:]:
        mod, qual = target.split(":")
        owner = importlib.import_module(mod)
        *path, attr = qual.split(".")
        for p in path:
            owner = getattr(owner, p)
        timed(owner, attr, target)
    watch_batches(S.Scheduler)
    b0, cpu0, t0 = busy_ticks(), time.process_time(), time.perf_counter()
    report = E._child_main(spec)
    wall = time.perf_counter() - t0
    others = (busy_ticks() - b0) / 100.0 - (time.process_time() - cpu0)  # USER_HZ = 100
    loop = {k: v for k, v in report["runs"][0]["loop"].items() if not isinstance(v, list | dict)}
    steps = max(1, loop["steps"])
    sched = loop["loop_cpu_s"] - loop["stand_in_cpu_s"] - loop["pricing_cpu_s"]
    res = {
        "policy": policy,
        "waiting": n,
        "wall_s": round(wall, 1),
        "loop": loop,
        "sched_cpu_ms_per_step": round(sched / steps * 1e3, 3),
        "pick_cpu_ms_per_step": round(loop["pick_cpu_s"] / steps * 1e3, 3),
        "timers_ms_per_step": {k: round(s / steps * 1e3, 3) for k, (_, s) in TIMES.items()},
        "timer_calls": {k: c for k, (c, _) in TIMES.items()},
        "others_cores_mean": round(others / wall, 3),
        "batch_regions64k_per_member": round(SPREAD[1] / max(1, SPREAD[0]), 4),
        "batch_span_mib": round(SPREAD[2] / max(1, SPREAD[0]), 1),
    }
    from feather_lab.bench.record import write_record

    write_record(out, **res)
    return res


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    print(json.dumps(main(sys.argv[1:]), indent=1))
