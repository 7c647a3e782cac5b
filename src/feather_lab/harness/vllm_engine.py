"""`feather bench --engine vllm`: the bench workloads on the real vLLM engine.

vLLM's own scheduler (`vllm`, FCFS: the baseline, reported as `vs_fcfs` = 1) against each
requested policy hosted by `FeatherScheduler`, in two KV regimes: under KV-cache pressure (a
few blocks: a mixed batch of prefixes does not fit, a homogeneous one does) and without. The
workloads are the simulator's generators scaled to a built-in random-weight Llama (`--model
tiny-llama`, the default, or `kv-bound`, whose decode steps are dominated by KV reads; see
`ENGINE_SCALES`: prompts fit `max_model_len`, token ids < vocab); `--model PATH` runs a real HF
model dir on tiny-llama's workloads instead.

Timing is wall clock on an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0): requests are
added at their arrival times and the engine is stepped until all finish; TTFT is measured at
the step that returned a request's first token. The engine process's CPU time is recorded too
(`output_tok_cpu_s`): on a shared machine it is the steadier comparison. Each configuration
runs `repeats` times,
interleaved across policies so slow spells of a shared machine hit all of them alike, and
rows report the median run (every run's throughput is kept in `output_tok_s_runs`).
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from feather_lab.bench.context import fit_context
from feather_lab.bench.report import add_relative
from feather_lab.harness.vllm_spec import (  # noqa: F401 (re-exported for the bench's callers)
    BASELINE,
    ENGINE_SCALES,
    EngineScale,
    KvScenario,
    VllmBenchSpec,
    engine_scale,
    engine_workload,
)
from feather_lab.sim.result import preemption_spread
from feather_sched.cost import BatchShape
from feather_sched.policies.base import policy_counters
from feather_sched.request import Request
from feather_sched.vllm.local import (
    CPU_THREAD_DEFAULTS,
    scheduler_of,
)

_RELATIVE = (("output_tok_s", "vs_fcfs"), ("output_tok_cpu_s", "vs_fcfs_cpu"))
"""`vs_fcfs`: output tokens/s relative to vLLM's own (FCFS) scheduler on the same workload
and KV scenario; `vs_fcfs_cpu` the same per CPU-second of the engine process (robust to
other load on a shared machine, blind to idle time)."""


def engine_env_defaults() -> None:
    """In-process engine (the bench reads the live scheduler), quiet logs, CPU threads."""
    for key, value in {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": "ERROR",
        **CPU_THREAD_DEFAULTS,
    }.items():
        os.environ.setdefault(key, value)


def require_vllm() -> None:
    """Fail with the install recipe when vLLM is missing (the main venv has no vLLM)."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise RuntimeError(
            "--engine vllm needs vLLM: pip install torch==2.13.0 && pip install -e '.[vllm]' "
            "&& pip uninstall -y torchvision torchaudio torchcodec  (see pyproject.toml)"
        ) from err
    from feather_sched.host.versions import check_engine_version

    check_engine_version("vllm")


@contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def model_dir(spec: VllmBenchSpec, cache: Path | None = None) -> tuple[str, str, int]:
    """(model path, dtype, vocab size): the given HF dir, or a built-in model (built once)."""
    from feather_lab.harness.tiny_llama import ENGINE_MODELS, build_tiny_llama

    name = spec.model or "tiny-llama"
    if name not in ENGINE_MODELS:
        config = json.loads((Path(name) / "config.json").read_text())
        return name, spec.dtype, int(config["vocab_size"])
    built = ENGINE_MODELS[name]
    root = cache or Path(os.environ.get("FEATHER_CACHE", Path.home() / ".cache" / "feather"))
    path = build_tiny_llama(root / name, built)
    return str(path), built.dtype, built.vocab_size


def make_llm(spec: VllmBenchSpec, path: str, dtype: str, num_blocks: int, feather: bool):
    """An in-process engine; `feather` selects FeatherScheduler (policy set per run)."""
    from vllm import LLM

    kwargs: dict[str, Any] = dict(
        dtype=dtype,
        max_model_len=spec.max_model_len,
        block_size=spec.block_size,
        num_gpu_blocks_override=num_blocks,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        gpu_memory_utilization=0.3,
        enforce_eager=True,
        seed=spec.seed,
    )
    if feather:
        kwargs["scheduler_cls"] = "feather_sched.vllm.FeatherScheduler"
    if spec.async_scheduling:
        kwargs["async_scheduling"] = True
    with _env(FEATHER_POLICY="fcfs"), keep_async_scheduling(spec.async_scheduling):
        # FEATHER_POLICY is replaced per run; fcfs needs no options
        return LLM(path, **kwargs)


@contextmanager
def keep_async_scheduling(enabled: bool = True) -> Iterator[None]:
    """Let an engine built inside this block keep `async_scheduling=True` on CPU.

    vLLM's CPU platform switches async scheduling off ("not required on CPU":
    vllm/platforms/cpu.py `check_and_update_config`), though its CPU model runner runs the
    pipelined loop (`EngineCore.step_with_batch_queue`) fine. This keeps what the config
    asked for, for engines built in the block only, so the GPU default can be exercised and
    measured here. Elsewhere (GPU platforms) it changes nothing.
    """
    if not enabled:
        yield
        return
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.__dict__["check_and_update_config"]

    def keep(cls, vllm_config) -> None:
        wanted = vllm_config.scheduler_config.async_scheduling
        original.__func__(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = wanted

    CpuPlatform.check_and_update_config = classmethod(keep)
    try:
        yield
    finally:
        CpuPlatform.check_and_update_config = original


def step_shape(sched, output) -> BatchShape:
    """The step's BatchShape from vLLM's state right after `schedule()` (which has already
    advanced num_computed_tokens by the scheduled tokens: vllm/v1/core/sched/scheduler.py
    `_update_after_schedule`). Block ids come from `KVCacheManager.get_block_ids`: requests
    sharing a cached prefix hold the same physical blocks, so sharing is read, not assumed."""
    bs = sched.block_size
    tables, contexts = [], []
    prefill_tokens = prefill_pairs = prefill_seqs = 0
    for rid, n in output.num_scheduled_tokens.items():
        req = sched.requests[rid]
        context = req.num_computed_tokens
        before = context - n
        tables.append(sched.kv_cache_manager.get_block_ids(rid)[0][: math.ceil(context / bs)])
        contexts.append(context)
        if before < req.num_tokens - 1:
            prefill_tokens += n
            prefill_pairs += n * before + n * (n + 1) // 2
            prefill_seqs += 1
    return BatchShape.from_block_tables(
        tables,
        bs,
        contexts,
        num_prefill_tokens=prefill_tokens,
        prefill_attn_pairs=prefill_pairs,
        num_prefill_seqs=prefill_seqs,
    )


class StepProbe:
    """Wraps a live scheduler's `schedule` / `_preempt_request` to see each step as the
    scheduler made it: counts (steps, batch sizes, prefix groups when `group_of` is given,
    preemptions, time in `schedule`) and, with `record_shapes`, each step's exact BatchShape.
    The bench and the calibration both read steps through it, so they agree on what a step
    was. A context manager: leaving it restores the scheduler's own methods."""

    def __init__(
        self,
        sched,
        group_of: Callable[[str], str | None] | None = None,
        record_shapes: bool = False,
    ) -> None:
        self.sched = sched
        self.group_of = group_of
        self.shapes: list[BatchShape] | None = [] if record_shapes else None
        self.steps = 0
        self.batch = 0
        self.groups = 0
        self.preempted: Counter[str] = Counter()  # request id -> times preempted
        self.preempted_kv_tokens = 0
        self.sched_s = 0.0
        self._schedule = sched.schedule
        self._preempt = sched._preempt_request
        sched.schedule = self._on_schedule
        sched._preempt_request = self._on_preempt

    def __enter__(self) -> StepProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_schedule(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self._schedule(*args, **kwargs)
        self.sched_s += time.perf_counter() - t0
        ids = out.num_scheduled_tokens
        if ids:
            self.steps += 1
            self.batch += len(ids)
            if self.group_of is not None:
                self.groups += len({self.group_of(r) for r in ids})
            if self.shapes is not None:
                self.shapes.append(step_shape(self.sched, out))
        return out

    def _on_preempt(self, request, *args, **kwargs):
        self.preempted[request.request_id] += 1
        self.preempted_kv_tokens += request.num_computed_tokens  # dropped, to be recomputed
        return self._preempt(request, *args, **kwargs)

    def close(self) -> None:
        del self.sched.schedule
        del self.sched._preempt_request


def run_once(
    llm, requests: Sequence[Request], label: str, record_shapes: bool = False
) -> dict[str, Any]:
    """Serve `requests` (at their arrival times) on a warm engine; one result row.
    `busy_s` is the measured time of its engine steps; with `record_shapes` the row also
    carries `step_shapes` (each step's BatchShape, for replaying the run through a cost
    model; not JSON: pop it before saving)."""
    llm.reset_prefix_cache()
    run = _Run(llm.llm_engine, sorted(requests, key=lambda r: r.arrival_time), label)
    with StepProbe(scheduler_of(llm), run.group.get, record_shapes) as probe:
        cpu_s = run.serve()
    run.check_finished()
    return run.row(probe, cpu_s)


class _Run:
    """One run of requests on one engine, and what happened to each (by the bench's request
    id): when it arrived, produced its first token and finished (with how many tokens), plus
    the time spent inside engine steps. Kept apart from the row so the timed loop does only
    bookkeeping."""

    def __init__(self, engine, order: Sequence[Request], label: str) -> None:
        self.engine = engine
        self.order = order
        self.label = label
        self.external: dict[str, Request] = {}
        self.group: dict[str, str | None] = {}
        """Engine-internal request id -> prefix group, for the probe's group count."""
        self.arrived: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.done: dict[str, tuple[float, int]] = {}
        self.busy = 0.0
        self.t0 = 0.0
        self._next = 0

    def serve(self) -> float:
        """Add each request once its arrival time has passed and step the engine until all
        have finished (sleeping while it is idle); the process's CPU seconds for it."""
        engine, order = self.engine, self.order
        self.t0, cpu0 = time.perf_counter(), time.process_time()
        while self._next < len(order) or engine.has_unfinished_requests():
            self._add_arrived()
            if not engine.has_unfinished_requests():
                wake = self.t0 + order[self._next].arrival_time
                time.sleep(max(0.0, wake - time.perf_counter()))
                continue
            self._step()
        return time.process_time() - cpu0

    def _add_arrived(self) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        now = time.perf_counter()
        while self._next < len(self.order) and self.order[self._next].arrival_time <= now - self.t0:
            r = self.order[self._next]
            rid = f"{self.label}-{r.request_id}"
            params = SamplingParams(
                max_tokens=r.output_len, ignore_eos=True, temperature=0.0, detokenize=False
            )
            prompt = TokensPrompt(prompt_token_ids=r.prompt.tolist())
            internal = self.engine.add_request(rid, prompt, params)
            self.external[rid] = r
            self.group[internal] = r.group or internal
            self.arrived[rid] = self.t0 + r.arrival_time
            self._next += 1

    def _step(self) -> None:
        started = time.perf_counter()
        outs = self.engine.step()
        t = time.perf_counter()
        self.busy += t - started
        for out in outs:
            n = len(out.outputs[0].token_ids)
            if n and out.request_id not in self.first:
                self.first[out.request_id] = t
            if out.finished:
                self.done[out.request_id] = (t, n)

    def check_finished(self) -> None:
        """A request that did not finish with its output length means the row's tokens are
        not the workload's: refuse the run rather than report it."""
        done = self.done
        bad = [rid for rid, r in self.external.items() if done.get(rid, (0, -1))[1] != r.output_len]
        if bad:
            raise RuntimeError(
                f"{len(bad)} requests did not finish with their output length: {bad[:3]}"
            )

    def row(self, probe: StepProbe, cpu_s: float) -> dict[str, Any]:
        """The run's result row: throughput, latency percentiles and the probe's counts."""
        finish = max(t for t, _ in self.done.values())
        makespan = finish - min(self.arrived.values())
        ttft = np.array([self.first[rid] - self.arrived[rid] for rid in self.external])
        latency = np.array([self.done[rid][0] - self.arrived[rid] for rid in self.external])
        tokens = sum(n for _, n in self.done.values())
        steps = max(1, probe.steps)
        return {
            "requests": len(self.external),
            "output_tokens": tokens,
            "makespan_s": round(makespan, 4),
            "output_tok_s": round(tokens / makespan, 2),
            "cpu_s": round(cpu_s, 3),
            "output_tok_cpu_s": round(tokens / cpu_s, 2),
            "mean_batch": round(probe.batch / steps, 2),
            "mean_prefix_groups": round(probe.groups / steps, 2),
            "ttft_p50_s": round(float(np.percentile(ttft, 50)), 4),
            "ttft_p99_s": round(float(np.percentile(ttft, 99)), 4),
            "latency_p50_s": round(float(np.percentile(latency, 50)), 4),
            "sched_us_per_step": round(probe.sched_s / steps * 1e6, 2),
            "steps": probe.steps,
            "preemptions": probe.preempted.total(),
            **preemption_spread([probe.preempted[rid] for rid in self.group]),
            "preempted_kv_tokens": probe.preempted_kv_tokens,
            "busy_s": round(self.busy, 4),
            **({"step_shapes": probe.shapes} if probe.shapes is not None else {}),
        }


def _warm_up(llm, vocab: int) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = np.random.default_rng(0)
    prompts = [TokensPrompt(prompt_token_ids=rng.integers(4, vocab, 64).tolist()) for _ in range(4)]
    llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)


def _set_policy(llm, name: str, options: dict[str, Any]) -> None:
    from feather_sched.policies.registry import make_policy

    scheduler_of(llm).feather.policy = make_policy(name, **options)


def run_vllm_bench(
    spec: VllmBenchSpec,
    on_progress: Callable[[str], None] | None = None,
    cache: Path | None = None,
) -> list[dict[str, Any]]:
    """Every (KV scenario, workload, policy), `repeats` times interleaved; median rows."""
    spec.validate()
    spec = spec.resolved()
    engine_env_defaults()
    require_vllm()
    tick = on_progress or (lambda _label: None)
    with _env(VLLM_ENABLE_V1_MULTIPROCESSING="0"):
        path, dtype, vocab = model_dir(spec, cache)
        assert spec.max_model_len is not None  # resolved
        workloads, dropped = {}, {}
        for w in spec.workloads:  # all checked before any engine starts
            requests = engine_workload(w, vocab, spec.seed, spec.scale)
            workloads[w], dropped[w] = fit_context(
                requests, spec.max_model_len, spec.drop_overlong, f"{w} (max_model_len)"
            )
        rows: list[dict[str, Any]] = []
        steps_file = spec.steps_out.open("w") if spec.steps_out is not None else None
        try:
            for scenario in spec.scenarios:
                for row in _run_scenario(
                    spec, scenario, path, dtype, vocab, workloads, tick, steps_file
                ):
                    rows.append({**row, "dropped_overlong": dropped[row["engine_workload"]]})
                # This scenario's engines are unreachable now; collect them before the next
                # ones start (an engine torn down later would take the process-wide
                # torch.distributed groups the live engines use with it).
                gc.collect()
        finally:
            if steps_file is not None:
                steps_file.close()
    add_relative(rows, BASELINE, _RELATIVE)
    return rows


def _run_scenario(
    spec: VllmBenchSpec,
    scenario: KvScenario,
    path: str,
    dtype: str,
    vocab: int,
    workloads: dict[str, list[Request]],
    tick: Callable[[str], None],
    steps_file: Any = None,
) -> list[dict[str, Any]]:
    """One KV size: a default engine and a Feather engine, each policy swapped in per run."""
    engines = open_engines(spec, scenario, path, dtype, vocab)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rep in range(spec.repeats):
        for key, row in run_repetition(
            spec, scenario, engines, workloads, rep, tick, steps_file=steps_file
        ):
            runs.setdefault(key, []).append(row)
    return median_rows(scenario, runs)


def open_engines(
    spec: VllmBenchSpec, scenario: KvScenario, path: str, dtype: str, vocab: int
) -> dict[str, Any]:
    """vLLM's own scheduler and FeatherScheduler at this KV size, warmed up. Engines share
    process-wide torch.distributed state: drop them only when no other engine is in use."""
    engines = {
        BASELINE: make_llm(spec, path, dtype, scenario.num_blocks, feather=False),
        "feather": make_llm(spec, path, dtype, scenario.num_blocks, feather=True),
    }
    for llm in engines.values():
        _warm_up(llm, vocab)
    return engines


def run_repetition(
    spec: VllmBenchSpec,
    scenario: KvScenario,
    engines: dict[str, Any],
    workloads: dict[str, list[Request]],
    rep: int,
    tick: Callable[[str], None],
    record_shapes: bool = False,
    steps_file: Any = None,
) -> Iterator[tuple[tuple[str, str], dict[str, Any]]]:
    """One run of every (workload, policy), the baseline first; ((workload, policy), row)."""
    for wname, requests in workloads.items():
        for pname in (BASELINE, *spec.policies):
            engine = engines[BASELINE if pname == BASELINE else "feather"]
            state = spec.policy_state if pname == "feather" else None
            if pname != BASELINE:
                options = dict(spec.policy_options.get(pname, {}))
                if state is not None and state.is_file():
                    options["policy_state"] = state
                _set_policy(engine, pname, options)
                if steps_file is not None:
                    from feather_lab.bench.steplog import StepRecorder

                    host = scheduler_of(engine).feather
                    labels = {"workload": wname, "policy": pname, "scenario": scenario.name}
                    host.policy = StepRecorder(host.policy, steps_file, {**labels, "repeat": rep})
            label = f"{scenario.name}/{wname}/{pname}/{rep}"
            tick(label)
            feather = scheduler_of(engine).feather if pname != BASELINE else None
            # The host's counters run over the engine's life: a row takes their increase.
            forced = feather.stats.forced if feather else 0
            errors = feather.stats.policy_errors if feather else 0
            row = run_once(engine, requests, label, record_shapes)
            if feather is not None:
                row.update(policy_counters(feather.policy))
                row["policy_errors"] = feather.stats.policy_errors - errors
                never_stall = feather.stats.forced - forced
                row["forced_admissions"] = never_stall + row.get("starvation_admits", 0)
            if state is not None and feather is not None:
                feather.policy.save(state)
            yield (wname, pname), row


def median_rows(
    scenario: KvScenario, runs: dict[tuple[str, str], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    rows = []
    for (wname, pname), results in runs.items():
        row = _median_row(f"{wname} ({scenario.name})", pname, results)
        rows.append(
            {
                **row,
                "kv_blocks": scenario.num_blocks,
                "scenario": scenario.name,
                "engine_workload": wname,
            }
        )
    return rows


def _median_row(workload: str, policy: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    speeds = [r["output_tok_s"] for r in results]
    mid = results[speeds.index(statistics.median_low(speeds))]
    return {
        "workload": workload,
        "policy": policy,
        **mid,
        "repeats": len(results),
        "output_tok_s_runs": speeds,
    }
