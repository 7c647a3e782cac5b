"""`feather bench --engine vllm`: the bench workloads on the real vLLM engine.

vLLM's own scheduler (`vllm`, FCFS: the baseline, `vs_fcfs` = 1) against each requested policy
hosted by `FeatherScheduler`, in each KV scenario of the model's scale (`vllm_spec`). Each
configuration runs `repeats` times, interleaved across policies so slow spells of a shared
machine hit all of them alike; rows report the median run (every run's throughput is kept in
`output_tok_s_runs`).
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from feather_lab.bench.context import fit_context
from feather_lab.bench.report import add_relative
from feather_lab.harness.eos_walk import off_rule, terminal_ids
from feather_lab.harness.vllm_engine import (
    engine_env_defaults,
    make_llm,
    model_dir,
    require_vllm,
    scoped_env,
    set_policy,
    warm_up,
)
from feather_lab.harness.vllm_run import run_once
from feather_lab.harness.vllm_spec import (
    BASELINE,
    EOS_TERMINALS,
    KvScenario,
    VllmBenchSpec,
    engine_workload,
)
from feather_sched.policies.base import policy_counters
from feather_sched.request import Request
from feather_sched.vllm.local import scheduler_of

_RELATIVE = (("output_tok_s", "vs_fcfs"), ("output_tok_cpu_s", "vs_fcfs_cpu"))
"""`vs_fcfs`: output tokens/s relative to vLLM's own (FCFS) scheduler on the same workload
and KV scenario; `vs_fcfs_cpu` the same per CPU-second of the engine process (robust to
other load on a shared machine, blind to idle time)."""


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
    with scoped_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"):
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
        warm_up(llm, vocab)
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
    """One run of every (workload, policy), the baseline first; ((workload, policy), row).
    Ending at EOS, each row counts the requests whose greedy output differs from the
    baseline's in this repetition (`outputs_differing`: scheduling must not change them)."""
    rule = _eos_rule(spec)
    for wname, requests in workloads.items():
        baseline_tokens: dict[str, Any] = {}
        for pname in (BASELINE, *spec.policies):
            engine = engines[BASELINE if pname == BASELINE else "feather"]
            state = spec.policy_state if pname == "feather" else None
            if pname != BASELINE:
                options = dict(spec.policy_options.get(pname, {}))
                if state is not None and state.is_file():
                    options["policy_state"] = state
                set_policy(engine, pname, options)
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
            row = run_once(engine, requests, label, record_shapes, spec.ignore_eos)
            if "output_token_ids" in row:
                tokens = row.pop("output_token_ids")
                baseline_tokens = tokens if pname == BASELINE else baseline_tokens
                row["outputs_differing"] = sum(
                    baseline_tokens.get(rid) != out for rid, out in tokens.items()
                )
                if rule is not None:
                    row["output_len_off_rule"] = off_rule(requests, tokens, *rule)
            if feather is not None:
                row.update(policy_counters(feather.policy))
                row["policy_errors"] = feather.stats.policy_errors - errors
                never_stall = feather.stats.forced - forced
                row["forced_admissions"] = never_stall + row.get("starvation_admits", 0)
            if state is not None and feather is not None:
                feather.policy.save(state)
            yield (wname, pname), row


def _eos_rule(spec: VllmBenchSpec) -> tuple[int, np.ndarray] | None:
    """(vocab, terminal ids) of the built-in model's EOS variant the runs use; None under
    ignore_eos or for a model directory (its own EOS)."""
    from feather_lab.harness.tiny_llama import ENGINE_MODELS

    model = ENGINE_MODELS.get(spec.model or "tiny-llama")
    if spec.ignore_eos or model is None:
        return None
    return model.vocab_size, terminal_ids(model.vocab_size, EOS_TERMINALS, model.seed)


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
    row = {
        "workload": workload,
        "policy": policy,
        **mid,
        "repeats": len(results),
        "output_tok_s_runs": speeds,
    }
    for key in ("outputs_differing", "output_len_off_rule"):
        if key in mid:  # any run's, not only the median's
            row[key] = max(r[key] for r in results)
    return row
