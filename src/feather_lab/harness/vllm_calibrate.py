"""`feather calibrate --engine vllm`: fit the step-time model to a real vLLM engine.

Measure the composition grid (`vllm_calibrate_samples`), fit the hardware profile and price
held-out compositions (`vllm_calibrate_fit`), then compare end to end (`vllm_calibrate_compare`).
The real bench runs are interleaved with the grid passes, so both see the same machine load.
The same command runs on a GPU (pass --model and a GPU base profile).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from feather_lab.harness.vllm_calibrate_compare import compare_end_to_end, replayed
from feather_lab.harness.vllm_calibrate_fit import fit_samples
from feather_lab.harness.vllm_calibrate_grid import GRIDS, default_compositions
from feather_lab.harness.vllm_calibrate_samples import Sample, measure, median_of_passes
from feather_lab.harness.vllm_calibrate_spec import CalibrateSpec
from feather_lab.harness.vllm_engine import engine_env_defaults, make_llm, model_dir, require_vllm
from feather_lab.harness.vllm_spec import ENGINE_SCALES, VllmBenchSpec, engine_workload
from feather_lab.harness.vllm_suite import median_rows, open_engines, run_repetition
from feather_sched.cost import ModelProfile
from feather_sched.cost import load_model as load_model_profile
from feather_sched.cost.composition import Composition


def run_calibration(
    spec: CalibrateSpec,
    out: Path,
    on_progress: Callable[[str], None] | None = None,
    cache: Path | None = None,
) -> dict[str, Any]:
    """Measure, fit, save the profile to `out`, compare end to end; the report dict."""
    engine_env_defaults()
    require_vllm()
    tick = on_progress or (lambda _label: None)
    spec.bench.validate()
    bench = spec.bench.resolved()
    model = _cost_model_profile(spec)
    path, dtype, vocab = model_dir(bench, cache)
    samples, runs = _measure(spec, bench, path, dtype, vocab, tick)
    fit = fit_samples(spec, model, samples, tick)
    fit.profile.save(out)
    tick("end-to-end comparison")
    rows = spec.bench_rows if spec.bench_rows is not None else replayed(runs, fit.profile, model)
    return {
        "profile_path": str(out),
        **fit.report(samples, model),
        "end_to_end": compare_end_to_end(fit.profile, model, bench, rows, vocab),
        "spec": spec.record(),
    }


def _cost_model_profile(spec: CalibrateSpec) -> ModelProfile:
    """The model profile the fit prices steps with: a built-in engine model has its own; a
    model directory's must be named, since its shape decides what a step costs."""
    model = spec.bench.model
    if spec.model_profile is None and not (model is None or model in ENGINE_SCALES):
        raise ValueError("--model DIR needs --model-profile (a model profile name or JSON file)")
    return load_model_profile(spec.model_profile or model or "tiny-llama")


def _measure(
    spec: CalibrateSpec,
    bench: VllmBenchSpec,
    path: str,
    dtype: str,
    vocab: int,
    tick: Callable[[str], None],
) -> tuple[list[Sample], list[dict[str, Any]]]:
    """Grid passes (the median over passes makes each sample) interleaved with repetitions
    of the real bench runs, so both see the same load: on a shared machine the speed of the
    same step drifts by tens of percent over minutes. Returns (samples, real-run rows with
    their step shapes); all engines stay alive to the end (see `open_engines`)."""
    blocks = spec.kv_blocks or max(sc.num_blocks for sc in bench.scenarios)
    cal = make_llm(bench, path, dtype, blocks, feather=False)
    grid = GRIDS.get(bench.model or "tiny-llama", GRIDS["tiny-llama"])
    comps = default_compositions(spec.quick, grid)
    measure(cal, Composition(4, 1, 64, 16, 4), vocab, bench.seed)  # warm-up, discarded
    passes: list[list[Sample]] = []

    def grid_pass() -> None:
        samples: list[Sample] = []
        for i, comp in enumerate(comps):
            tick(f"pass {len(passes) + 1}: {comp.label} ({i + 1}/{len(comps)})")
            samples += measure(cal, comp, vocab, bench.seed + i)
        passes.append(samples)

    rows: list[dict[str, Any]] = []
    alive = [cal]  # no engine may be collected while another still runs
    if spec.bench_rows is None:
        workloads = {w: engine_workload(w, vocab, bench.seed, bench.scale) for w in bench.workloads}
        for scenario in bench.scenarios:
            engines = open_engines(bench, scenario, path, dtype, vocab)
            alive.append(engines)
            runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for rep in range(bench.repeats):
                grid_pass()
                for key, row in run_repetition(
                    bench, scenario, engines, workloads, rep, tick, record_shapes=True
                ):
                    runs.setdefault(key, []).append(row)
            rows += median_rows(scenario, runs)
    while len(passes) < spec.passes:
        grid_pass()
    return median_of_passes(passes), rows
