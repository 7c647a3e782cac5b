"""What a live `vllm serve`'s engine core keeps and spends between runs
(benchmarks/replay/README.md,
"no-sharing after paper-32g"): does a server's previous run leave state behind that slows its
next one, and does Feather's scheduler leave more than vLLM's?

Two scheduler subclasses, loaded by `--scheduler-cls core_state.<name>` from this directory
(`state_spec` makes the server spec): `StateScheduler` (vLLM's own) and
`StateFeatherScheduler` (Feather's). Per run they add up, in the engine core: the steps, their
durations (from `schedule()` to its output, as `replay_steps.py` times them) and shapes
(requests, tokens), the time
inside `schedule()` and `update_from_output()`, and every cyclic-GC pass (a `gc.callbacks`
hook: passes, seconds and objects collected per generation). A daemon thread waits for the
driver's request (`<log>.snap` holding a tag), and while the engine sits idle writes one JSON
line to the log: those sums since the last line, Python's object counts (`gc.get_count`, the
unfrozen objects `gc.get_objects` sees per generation, vLLM having frozen its startup heap,
the most common types among them), the process's RSS, CPU time, page faults and glibc heap
since the last line, vLLM's request maps and the order of its free KV blocks, and for
Feather's scheduler the size of every structure it keeps (tracker, CHT, adapter, policy).
Then it zeroes the sums. The objects are counted outside the timed runs.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import itertools
import json
import os
import resource
import statistics
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from feather_sched.vllm.scheduler import FeatherScheduler

STATE_ENV = "FEATHER_CORE_STATE"
"""The JSON-lines file the engine core writes its snapshots to."""
HERE = Path(__file__).resolve().parent


class _CoreState:
    """The sums, the GC hook and the snapshot thread: a mixin placed before a vLLM scheduler
    class, whose `schedule` and `update_from_output` it times (through `super()`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._path = Path(os.environ[STATE_ENV])
        self._out = self._path.open("a", buffering=1)
        self._started: dict[int, float] = {}
        self._last_done = 0.0
        self._zero()
        self._usage = _usage()
        gc.callbacks.append(self._on_gc)
        threading.Thread(target=self._serve_snapshots, daemon=True).start()

    def _zero(self) -> None:
        self._steps: list[float] = []
        self._shapes: list[tuple[int, int]] = []  # per step: requests, tokens scheduled
        self._schedule_s = self._update_s = 0.0
        self._gc = {g: [0, 0.0, 0] for g in range(3)}  # passes, seconds, collected
        self._gc_t0 = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
            return
        entry = self._gc[info["generation"]]
        entry[0] += 1
        entry[1] += time.perf_counter() - self._gc_t0
        entry[2] += info.get("collected", 0)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = super().schedule(*args, **kwargs)  # type: ignore[misc]
        self._schedule_s += time.perf_counter() - start
        if out.total_num_scheduled_tokens > 0:
            self._started[id(out)] = start
            self._shapes.append((len(out.num_scheduled_tokens), out.total_num_scheduled_tokens))
        return out

    def update_from_output(self, scheduler_output: Any, model_output: Any) -> Any:
        t0 = time.perf_counter()
        result = super().update_from_output(scheduler_output, model_output)  # type: ignore[misc]
        done = time.perf_counter()
        self._update_s += done - t0
        start = self._started.pop(id(scheduler_output), None)
        if start is not None:
            self._steps.append(done - max(start, self._last_done))
            self._last_done = done
        return result

    def _serve_snapshots(self) -> None:
        request = self._path.with_suffix(".snap")
        while True:
            time.sleep(0.2)
            if request.exists():
                tag = request.read_text().strip()
                request.unlink()
                self._out.write(json.dumps(self._snapshot(tag), separators=(",", ":")) + "\n")

    def _snapshot(self, tag: str) -> dict[str, Any]:
        steps = self._steps
        line = {
            "tag": tag,
            "time": round(time.time(), 3),
            "steps": len(steps),
            "step_s": round(sum(steps), 4),
            "step_median_s": round(statistics.median(steps), 5) if steps else None,
            "step_durations": [round(s, 5) for s in steps],
            "step_shapes": self._shapes,
            "schedule_s": round(self._schedule_s, 4),
            "update_s": round(self._update_s, 4),
            "gc": {str(g): [n, round(s, 4), c] for g, (n, s, c) in self._gc.items()},
        }
        self._zero()
        usage, self._usage = self._usage, _usage()
        line["rusage"] = {k: round(v - usage[k], 3) for k, v in self._usage.items()}
        line["malloc"] = _mallinfo()
        line.update(_python_heap())
        line["vllm"] = _vllm_sizes(self)
        if hasattr(self, "feather"):
            line["feather"] = feather_sizes(self)
            line["policy"] = policy_state(self.feather.policy)
        return line


def _python_heap() -> dict[str, Any]:
    """The process's cyclic-GC picture: the generation counters, the unfrozen tracked objects
    per generation (what a full pass walks) and their commonest types, the frozen count, RSS."""
    per_gen = [gc.get_objects(g) for g in range(3)]
    types = Counter(type(o).__name__ for objs in per_gen for o in objs)
    rss = next(
        int(line.split()[1])
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return {
        "gc_count": list(gc.get_count()),
        "gc_objects": [len(objs) for objs in per_gen],
        "gc_frozen": gc.get_freeze_count(),
        "gc_top_types": types.most_common(20),
        "rss_kib": rss,
    }


def _usage() -> dict[str, float]:
    """The process's own CPU seconds, page faults and context switches so far."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "utime_s": u.ru_utime,
        "stime_s": u.ru_stime,
        "minflt": u.ru_minflt,
        "majflt": u.ru_majflt,
        "nvcsw": u.ru_nvcsw,
        "nivcsw": u.ru_nivcsw,
    }


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def _mallinfo() -> dict[str, int] | None:
    """glibc's heap (`mallinfo2`, glibc >= 2.33): bytes in the main heap and arenas
    (`arena`), in mmap'd blocks (`hblkhd`), in use (`uordblks`), free but kept
    (`fordblks`); None where the C library has no mallinfo2."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    info = fn()
    return {name: int(getattr(info, name)) for name in ("arena", "hblkhd", "uordblks", "fordblks")}


def _vllm_sizes(sched: Any) -> dict[str, Any]:
    """vLLM's request maps and its KV free queue: the order the next run's blocks come in
    (`free_queue_sequential`: the share of neighbours in it whose block ids follow on, 1.0
    in a fresh pool, so a request's blocks lie side by side in the KV tensor)."""
    pool = sched.kv_cache_manager.block_pool
    cached = getattr(pool, "cached_block_hash_to_block", None)
    free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    steps = [b - a for a, b in itertools.pairwise(free)]
    return {
        "free_blocks": len(free),
        "free_queue_sequential": round(sum(d == 1 for d in steps) / max(1, len(steps)), 4),
        "free_queue_head": free[:8],
        "requests": len(sched.requests),
        "running": len(sched.running),
        "waiting": len(sched.waiting),
        "finished_req_ids": len(sched.finished_req_ids),
        "cached_block_hashes": len(cached) if cached is not None else -1,
    }


def feather_sizes(sched: Any) -> dict[str, int]:
    """Every per-request or growing structure Feather's scheduler keeps (0 everywhere per
    request once no request is left, if nothing leaks)."""
    c = sched.feather
    tracker, cht, policy = c.index, c.index.cht, c.policy
    sizes = {
        "tracker_meta": tracker.num_tracked,
        "tracker_waiting_ids": len(tracker.waiting_ids),
        "tracker_running_ids": len(tracker.running_ids),
        "cht_requests": len(cht),
        "cht_leaf": len(cht._leaf),
        "cht_running": len(cht._running),
        "cht_end_keys": len(cht._end_keys),
        "cht_root_children": len(cht._root.children or {}),
        "cht_hot": len(cht._hot),
        "cht_in_hot": len(cht._in_hot),
        "controller_requests": len(c._requests),
        "controller_pending": len(c._pending),
        "controller_admission_hits": len(c.admission_hits),
        "queue_members": len(c.queue.members) if c.queue is not None else -1,
        "feather_steps": len(sched._feather_steps),
    }
    learner, prior = getattr(policy, "learner", None), getattr(policy, "stop_prior", None)
    parts = {
        "_priors": prior and prior.cache,
        "history": getattr(policy, "history", None),
        "_windows": learner and learner.windows,
    }
    for name, value in parts.items():
        if value is not None:
            sizes[f"policy{name}"] = len(value)
    table = getattr(policy, "table", None)
    if table is not None:
        sizes["policy_table_states"] = len(table.stats)
    sizes.update({f"stats_{k}": v for k, v in dataclasses.asdict(c.stats).items()
                  if isinstance(v, int)})  # fmt: skip
    return sizes


def policy_state(policy: Any) -> dict[str, Any]:
    """The policy's learning so far (a server never resets it: lifetime counts): decisions
    asked, STOPs, exploratory STOPs, the exploration budget left, the STOP delay bound's
    vetoes and held seconds, and the bandit's table."""
    out = {k: getattr(policy, k) for k in ("decisions", "stops", "explorations", "budget",
                                           "total_decisions", "reward_scale")
           if hasattr(policy, k)}  # fmt: skip
    delay = getattr(policy, "delay", None)
    if delay is not None:
        out.update(delay_vetoes=delay.vetoes, delay_held_s=round(delay.held_s, 3))
    table = getattr(policy, "table", None)
    if table is not None:
        out["table"] = table.to_dict()
    return out


class StateScheduler(_CoreState, Scheduler):
    """vLLM's own scheduler, its runs summed and its state snapshotted (module doc)."""


class StateFeatherScheduler(_CoreState, FeatherScheduler):
    """Feather's scheduler, the same."""


def state_spec(spec: Any, log: Path) -> Any:
    """`spec` (a `harness.vllm_server.ServerSpec`) with its scheduler's state logged to
    `log`. Ask for a snapshot with `request_snapshot(log, tag)`."""
    env = {**dict(spec.env), STATE_ENV: str(log.resolve()), "PYTHONPATH": str(HERE)}
    cls = "StateFeatherScheduler" if spec.feather else "StateScheduler"
    return dataclasses.replace(spec, env=tuple(env.items()), scheduler_cls=f"core_state.{cls}")


def request_snapshot(log: Path, tag: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Ask the engine core logging to `log` for a snapshot tagged `tag`; its line."""
    log.with_suffix(".snap").write_text(tag)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists():
            for text in log.read_text().splitlines():
                line = json.loads(text)
                if line["tag"] == tag:
                    return line
        time.sleep(0.2)
    raise RuntimeError(f"no snapshot {tag!r} in {log} after {timeout_s:.0f} s")
