"""`feather bench --engine sglang`: the `--engine vllm` workloads and KV scenarios served by
SGLang's real scheduler loop (`sglang_engine`: one scheduler process per KV scenario and
policy), SGLang's own fcfs / lpm / dfs-weight beside Feather's policies through the plugin."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from feather_lab.harness.sglang_engine import serve
from feather_lab.harness.sglang_spec import ServeRequest, ServeSpec
from feather_lab.harness.tiny_llama import ENGINE_MODELS, TinyLlamaSpec
from feather_lab.harness.vllm_spec import EngineBenchSpec

SGLANG_INSTALL = (
    "pip install torch==2.13.0 && pip install --no-deps sglang==0.5.23 && "
    "pip install -e '.[sglang]' (from a source checkout; see the 'sglang' extra in "
    "pyproject.toml)"
)
"""How to install SGLang for the CPU bench (sglang pins CUDA packages: hence --no-deps)."""
SGLANG_POLICIES = ("fcfs", "lpm", "dfs-weight")
"""SGLang's own `--schedule-policy` names the bench runs with the plugin off (under
`--engine sglang` these names mean SGLang's code, not Feather's reimplementations)."""
BASELINE = "fcfs"
"""SGLang's own FCFS: the baseline of `vs_fcfs`, always run."""
SGLANG_DEFAULT_POLICIES = ("fcfs", "lpm", "feather", "feather-paper", "feather-upstream")
"""SGLang's own fcfs and lpm beside Feather and the authors' two policies."""
STEP_COST_PROFILES = {
    "tiny-llama": "cpu-vllm-fitted.json",
    "kv-bound": "cpu-kv-bound-fitted.json",
}
"""The calibrated CPU hardware profile (benchmarks/vllm/) each built-in model's stand-in forward
sleeps by, with the model profile of the same name (`feather calibrate --engine vllm`)."""
BENCH_NOTE = (
    "SGLang's real Scheduler loop (batch building, radix cache, KV pool, chunked prefill, "
    "retraction, the plugin) on CPU; the model forward is a stand-in that sleeps the "
    "calibrated CPU cost of each batch's real shape. It shows what each policy's batches "
    "cost by that model plus the scheduler's own CPU time, with SGLang's memory rules in "
    "charge; it cannot show GPU kernel effects the cost model does not price, nor SGLang's "
    "overlap loop or CUDA graphs. Feather policies run on top of SGLang's fcfs; a Feather "
    "policy keeps its learned state across the runs of one scheduler process."
)


@dataclass(frozen=True)
class SGLangBenchSpec(EngineBenchSpec):
    """`feather bench --engine sglang`: the `--engine vllm` workloads and KV scenarios
    (`VllmBenchSpec`'s, blocks of `block_size` tokens -> SGLang's `max_total_tokens`)."""

    policies: Sequence[str] = SGLANG_DEFAULT_POLICIES
    step_cost: tuple[str, str] | None = None
    """(hardware, model) profile of the stand-in's cost; None: the model's calibrated one."""

    def validate(self) -> None:
        from feather_lab.harness.vllm_spec import ENGINE_SCALES, engine_scale
        from feather_sched.policies.registry import policy_names

        valid = list(dict.fromkeys([*SGLANG_POLICIES, *policy_names()]))
        bad = [p for p in self.policies if p not in valid]
        if bad:
            raise ValueError(f"unknown policies {bad} for --engine sglang; valid: {valid}")
        if self.model is not None and self.model not in ENGINE_SCALES:
            raise ValueError(
                f"--engine sglang runs a stand-in of a built-in model ({', '.join(ENGINE_SCALES)})"
                f", got {self.model!r}"
            )
        known = engine_scale(self.model).workloads
        unknown = [w for w in self.workloads or () if w not in known]
        if unknown:
            raise ValueError(f"workloads {unknown} unknown; valid: {', '.join(known)}")
        if self.repeats < 1:
            raise ValueError("need repeats >= 1")

    def cost_profiles(self) -> tuple[str, str]:
        if self.step_cost is not None:
            return self.step_cost
        name = self.model or "tiny-llama"
        records = Path(__file__).resolve().parents[3] / "benchmarks" / "vllm"
        path = records / STEP_COST_PROFILES[name]
        if not path.is_file():
            raise FileNotFoundError(f"calibrated CPU profile {path} not found (a repo checkout)")
        return str(path), name


def _shown(path: str) -> str:
    """A profile path as a record shows it: relative to the checkout when inside it (no
    machine's path in a committed record)."""
    p, root = Path(path), Path(__file__).resolve().parents[3]
    return str(p.relative_to(root)) if p.is_relative_to(root) else path


def _bench_requests(requests, label: str) -> list[ServeRequest]:
    return [
        ServeRequest(
            rid=f"{label}-{i:05d}",
            prompt=[int(t) for t in r.prompt],
            output_len=int(r.output_len),
            arrival_s=float(r.arrival_time),
            group=r.group,
        )
        for i, r in enumerate(sorted(requests, key=lambda r: r.arrival_time))
    ]


def _stand_in_of(model: str | None) -> TinyLlamaSpec:
    return ENGINE_MODELS[model or "tiny-llama"]


def run_sglang_suite(
    spec: SGLangBenchSpec, on_progress: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """One scheduler process per (KV scenario, policy), serving every workload `repeats`
    times (cache flushed between runs); median rows, `vs_fcfs` against SGLang's fcfs."""
    from feather_lab.bench.report import add_relative
    from feather_lab.harness.vllm_spec import engine_scale, engine_workload

    spec.validate()
    tick = on_progress or (lambda _label: None)
    scale = engine_scale(spec.model)
    model = _stand_in_of(spec.model)
    workloads = {
        w: engine_workload(w, model.vocab_size, spec.seed, scale)
        for w in (spec.workloads or scale.default_workloads)
    }
    policies = [BASELINE, *[p for p in spec.policies if p != BASELINE]]
    rows: list[dict[str, Any]] = []
    for scenario in spec.scenarios or scale.scenarios:
        for pname in policies:
            serve_spec, keys = _serve_spec(spec, scenario, pname, workloads, model)
            tick(f"{scenario.name}/{pname}: scheduler process, {len(keys)} runs")
            report = serve(serve_spec)
            rows += _median_rows(report, keys, workloads, scenario, pname, serve_spec)
    add_relative(rows, BASELINE, (("output_tok_s", "vs_fcfs"), ("output_tok_cpu_s", "vs_fcfs_cpu")))
    return rows


def _serve_spec(spec: SGLangBenchSpec, scenario, pname: str, workloads, model):
    """One scheduler process's spec: every workload `repeats` times under one KV scenario and
    policy (SGLang's own, or Feather's through the plugin on top of SGLang's fcfs); with the
    workload name of each run."""
    own = pname in SGLANG_POLICIES
    runs, keys = [], []
    for rep in range(spec.repeats):
        for wname, reqs in workloads.items():
            label = f"{scenario.name}/{wname}/{pname}/{rep}".replace("/", ".")
            runs.append(_bench_requests(reqs, label))
            keys.append(wname)
    state = spec.policy_state if pname == "feather" else None
    serve_spec = ServeSpec(
        runs=runs,
        feather_policy=None if own else pname,
        schedule_policy=pname if own else "fcfs",
        policy_state=None if state is None else str(state),
        model=model,
        max_total_tokens=scenario.num_blocks * spec.block_size,
        max_running_requests=spec.max_num_seqs,
        chunked_prefill_size=spec.max_num_batched_tokens,
        max_prefill_tokens=spec.max_num_batched_tokens,
        step_cost=spec.cost_profiles(),
        run_timeout_s=600.0,
        seed=spec.seed,
    )
    return serve_spec, keys


def _median_rows(report, keys, workloads, scenario, pname: str, serve_spec) -> list[dict]:
    """One row per workload: its median run (by output tokens/s), every run's speed, and the
    plugin's counters when Feather ran."""
    import statistics

    by_workload: dict[str, list[dict[str, Any]]] = {}
    for wname, run in zip(keys, report["runs"], strict=True):
        by_workload.setdefault(wname, []).append(_run_row(run, workloads[wname]))
    rows = []
    for wname, results in by_workload.items():
        speeds = [r["output_tok_s"] for r in results]
        mid = results[speeds.index(statistics.median_low(speeds))]
        row = {
            "workload": f"{wname} ({scenario.name})",
            "policy": pname,
            **mid,
            "repeats": len(results),
            "output_tok_s_runs": speeds,
            "kv_tokens": serve_spec.max_total_tokens,
            "scenario": scenario.name,
            "engine_workload": wname,
            "sglang_schedule_policy": serve_spec.schedule_policy,
            "feather_plugin": serve_spec.feather_policy is not None,
        }
        if report["feather"] is not None:
            stats = report["feather"]["stats"]
            row["policy_errors"] = stats["policy_errors"]
            row["feather_stops"] = stats["stops"]
            row.update(report["feather"]["counters"])
        rows.append(row)
    return rows


def _run_row(run: dict[str, Any], requests) -> dict[str, Any]:
    """One run's result row, the fields of `--engine vllm`'s rows."""
    import numpy as np

    reqs = run["requests"]
    bad = [
        rid
        for rid, r in reqs.items()
        if r["finish_messages"] != 1 or r["reason"]["type"] != "length"
    ]
    if bad or len(reqs) != len(requests):
        raise RuntimeError(f"{len(bad)} requests did not finish once with their length: {bad[:3]}")
    arrived = {rid: r["sent"] for rid, r in reqs.items()}
    makespan = max(r["finished"] for r in reqs.values()) - min(arrived.values())
    tokens = sum(r["tokens"] for r in reqs.values())
    ttft = np.array([r["first"] - r["sent"] for r in reqs.values()])
    latency = np.array([r["finished"] - r["sent"] for r in reqs.values()])
    loop = run["loop"]
    steps = max(1, loop["steps"])
    cpu_s = max(run.get("cpu_s", 0.0), 1e-9)
    return {
        "requests": len(reqs),
        "output_tokens": tokens,
        "makespan_s": round(makespan, 4),
        "output_tok_s": round(tokens / makespan, 2),
        "cpu_s": round(cpu_s, 3),
        "output_tok_cpu_s": round(tokens / cpu_s, 2),
        "mean_batch": round(loop["batch"] / steps, 2),
        "mean_prefix_groups": round(loop["groups"] / steps, 2),
        "ttft_p50_s": round(float(np.percentile(ttft, 50)), 4),
        "ttft_p99_s": round(float(np.percentile(ttft, 99)), 4),
        "latency_p50_s": round(float(np.percentile(latency, 50)), 4),
        "sched_us_per_step": round(loop["pick_s"] / steps * 1e6, 2),
        "steps": loop["steps"],
        "preemptions": loop["retractions"],
        "stand_in_s": round(loop.get("stand_in_s", 0.0), 4),
    }


def require_sglang() -> None:
    """A RuntimeError saying how to install SGLang when it is missing, or not a supported
    release; checked before any scheduler process starts."""
    if importlib.util.find_spec("sglang") is None:
        raise RuntimeError(f"--engine sglang needs SGLang, not installed here: {SGLANG_INSTALL}")
    from feather_sched.host.versions import check_engine_version

    check_engine_version("sglang")


def bench_from_cli(
    *,
    workloads: Sequence[str],
    policies: Sequence[str],
    model: str | None,
    scenarios: Sequence[Any] | None,
    max_num_seqs: int | None,
    max_batched_tokens: int,
    repeats: int,
    seed: int,
    policy_state: Path | None,
    on_progress: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
    """`feather bench --engine sglang`'s rows, title and JSON config (cli.py prints them)."""
    spec = SGLangBenchSpec(
        workloads=tuple(workloads) or None,
        policies=tuple(policies) or SGLANG_DEFAULT_POLICIES,
        model=model,
        scenarios=scenarios,
        max_num_seqs=max_num_seqs or SGLangBenchSpec.max_num_seqs,
        max_num_batched_tokens=max_batched_tokens,
        repeats=repeats,
        seed=seed,
        policy_state=policy_state,
    )
    spec.validate()
    require_sglang()
    rows = run_sglang_suite(spec, on_progress)
    hardware, cost_model = spec.cost_profiles()
    title = (
        f"feather bench --engine sglang: {model or 'tiny-llama'} stand-in "
        f"(cost {Path(hardware).stem}), seed {seed}, {repeats} runs"
    )
    config = {
        "engine": "sglang",
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items()},
        "step_cost": {"hardware": _shown(hardware), "model": cost_model},
        "note": BENCH_NOTE,
    }
    return rows, title, config
