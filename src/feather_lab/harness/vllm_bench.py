"""`feather vllm-bench`: the CPU of vLLM's own `schedule()` against Feather's, at long queues.

The vLLM counterpart of `feather sglang-bench` (harness/sglang_bench.py): one in-process engine
with vLLM's own scheduler and one with `FeatherScheduler`, fed the same request stream.
Feather's added CPU is read two ways: its own code inside `schedule()` (`feather_part_us`),
and the difference of the two engines' `schedule()` medians. Per queue length, the median (and
min, max) over `repeats` runs, interleaved (each repeat, each size, vLLM's engine then
Feather's).
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from feather_lab.harness.vllm_bench_run import run_once
from feather_lab.harness.vllm_bench_spec import VllmPassSpec


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
