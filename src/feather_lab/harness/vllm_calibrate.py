"""`feather calibrate --engine vllm`: fit the step-time model to a real vLLM engine.

1. Measure. For each composition (batch size, distinct prefixes, prefix and suffix lengths) a
   fresh batch is served on an in-process engine with ample KV; every engine iteration is
   timed (`LLMEngine.step`, wall clock) and paired with its exact BatchShape, read from
   vLLM's block tables at scheduling time (`KVCacheManager.get_block_ids`: requests sharing a
   prefix hold the same physical blocks, so sharing is measured, not assumed). Decode steps
   of one composition are near-identical, so they collapse to one sample (median time);
   every step that prefills is its own sample.
2. Fit `HardwareProfile.FIT_FIELDS` on the training compositions (`cost.fit`), starting
   from a base profile's peak figures, and report the step-time MAPE on held-out
   compositions (every `holdout_every`-th one, never seen by the fit).
3. End to end: the simulator with the fitted profile vs the real engine on the bench
   workloads (`vllm_engine`), same KV sizes and engine limits. The real runs are interleaved
   with the grid passes (same machine load for both), and each is also replayed through the
   fitted model step by step ("model on real steps"), which separates the cost model's error
   from the simulator's scheduling error.

The same command runs on a GPU (pass --model and a GPU base profile).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from feather_lab.harness.vllm_engine import engine_env_defaults, make_llm, model_dir, require_vllm
from feather_lab.harness.vllm_spec import BASELINE, ENGINE_SCALES, VllmBenchSpec, engine_workload
from feather_lab.harness.vllm_steps import StepProbe
from feather_lab.harness.vllm_suite import median_rows, open_engines, run_repetition
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_sched.cost import (
    BatchShape,
    HardwareProfile,
    ModelProfile,
    StepCostModel,
    load_hardware,
)
from feather_sched.cost import load_model as load_model_profile
from feather_sched.cost.composition import Composition
from feather_sched.cost.fit import fit_profile, mape, predict, stamp_fitted
from feather_sched.vllm.local import scheduler_of


@dataclass(frozen=True)
class Grid:
    """A model's composition grid: batch sizes, distinct-prefix counts, prompt lengths.
    `group_counts` None means {1, batch // 8, batch} (one, a few, all distinct)."""

    batches: tuple[int, ...]
    prefix_lens: tuple[int, ...]
    suffix_lens: tuple[int, ...]
    group_counts: tuple[int, ...] | None = None
    late: bool = True
    """Also each batch >= 16 with arrivals during decode (mixed steps)."""
    grouped_counts: tuple[int, ...] = ()
    """Prefix counts also measured with each prefix's requests adjacent (longest prefix)."""
    extra: tuple[tuple[int, int, bool], ...] = ()
    """(batch, prefixes, grouped) at the longest prefix only: a few large batches."""

    def groups(self, batch: int) -> list[int]:
        if self.group_counts is None:
            return sorted({1, max(1, batch // 8), batch})
        return [g for g in self.group_counts if g <= batch]


GRIDS: dict[str, Grid] = {
    "tiny-llama": Grid((1, 4, 16, 32, 64), (128, 512, 896), (16, 64)),
    # Locality: 1 to 32 distinct 2,048-token prefixes (8 MiB of KV per layer each, against a
    # 32 MiB L3), batches 8-64, and 512-token prefixes that fit the cache however mixed.
    # The bench's FCFS batches (256 requests of 32 prefixes) are larger still: a few of
    # those at the longest prefix, where the cache-reuse term is decided.
    "kv-bound": Grid(
        (8, 16, 32, 64),
        (512, 2048),
        (16,),
        (1, 2, 4, 8, 16, 32),
        late=False,
        grouped_counts=(4, 16),
        extra=((128, 8, False), (128, 32, False), (256, 32, False), (256, 32, True)),
    ),
}
QUICK_GRID = Grid((1, 4, 16), (128, 512), (16,))


def default_compositions(
    quick: bool = False, grid: Grid = GRIDS["tiny-llama"]
) -> list[Composition]:
    """The grid's compositions, each batch with its prefix counts and lengths."""
    grid = QUICK_GRID if quick else grid
    steps = 8 if quick else 16
    out = []
    for b in grid.batches:
        for g in grid.groups(b):
            for p in grid.prefix_lens:
                for s in grid.suffix_lens:
                    out.append(Composition(b, g, p, s, steps))
                if grid.late and b >= 16:  # and the same batch with arrivals during decode
                    out.append(Composition(b, g, p, grid.suffix_lens[0], steps, late=4))
            if g in grid.grouped_counts:
                out.append(
                    Composition(
                        b, g, max(grid.prefix_lens), grid.suffix_lens[0], steps, grouped=True
                    )
                )
    longest, suffix = max(grid.prefix_lens), grid.suffix_lens[0]
    out += [Composition(b, g, longest, suffix, steps, grouped=o) for b, g, o in grid.extra]
    return out


@dataclass
class Sample:
    composition: str
    kind: str
    """Sample kind: decode (the median of a composition's full-batch decode steps), or
    prefill / mixed (one step with prefill work; mixed: with decodes in the same step)."""
    shape: BatchShape
    seconds: float


COMPARE_POLICIES = ("grouped", "feather")
"""The policies a calibration compares end to end by default (beside vLLM's own)."""


@dataclass(frozen=True)
class CalibrateSpec:
    """What `feather calibrate` measures, fits and compares: the composition grid and the
    fit's own settings, around the one bench spec both engines are built from."""

    bench: VllmBenchSpec = field(default_factory=lambda: VllmBenchSpec(policies=COMPARE_POLICIES))
    """The real-engine bench the fitted model is compared with end to end (its `repeats`:
    runs per configuration). Its model, block size, context length and token budget also
    build the grid's engine, so the measured steps and the compared runs share one engine
    configuration."""
    base_hardware: str = "cpu"
    model_profile: str | None = None
    """Model profile (name or JSON) for the cost model; None: the built-in model's own."""
    kv_blocks: int | None = None
    """KV blocks of the grid's engine; None: the bench's largest scenario."""
    holdout_every: int = 4
    passes: int = 5
    """Passes over the composition grid; each sample's time is the median over passes."""
    quick: bool = False
    bench_rows: list[dict[str, Any]] | None = field(default=None, compare=False)
    """Real-engine rows from `feather bench --engine vllm` to compare with (None: run them)."""

    def record(self) -> dict[str, Any]:
        """The spec as a calibration report stores it: the compared bench's fields under the
        report's established names (`compare_*`), so reports stay comparable across runs."""
        bench = asdict(self.bench)
        return {
            "model": bench["model"],
            "base_hardware": self.base_hardware,
            "model_profile": self.model_profile,
            "block_size": bench["block_size"],
            "max_model_len": bench["max_model_len"],
            "max_num_batched_tokens": bench["max_num_batched_tokens"],
            "kv_blocks": self.kv_blocks,
            "holdout_every": self.holdout_every,
            "repeats": self.passes,
            "quick": self.quick,
            "seed": bench["seed"],
            "compare_workloads": bench["workloads"],
            "compare_policies": bench["policies"],
            "compare_scenarios": bench["scenarios"],
            "compare_repeats": bench["repeats"],
            "policy_options": bench["policy_options"],
        }


def measure(llm, comp: Composition, vocab: int, seed: int) -> list[Sample]:
    """Serve one composition from an empty prefix cache; its samples."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = np.random.default_rng(seed)
    engine = llm.llm_engine
    llm.reset_prefix_cache()
    prefixes = [rng.integers(4, vocab, comp.prefix_len) for _ in range(comp.prefixes)]
    # The first requests decode while later ones still prefill (chunked, one token budget a
    # step): give every request enough tokens to outlast the prefill, so `decode_steps` steps
    # of the whole batch decoding together follow it.
    budget = llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    prefill = comp.prefixes * comp.prefix_len + comp.batch * comp.suffix_len
    params = SamplingParams(
        max_tokens=comp.decode_steps + 1 + math.ceil(prefill / budget),
        ignore_eos=True,
        temperature=0.0,
        detokenize=False,
    )
    prompts = [
        np.concatenate([prefixes[comp.prefix_of(i)], rng.integers(4, vocab, comp.suffix_len)])
        for i in range(comp.batch)
    ]
    late = prompts[comp.batch - comp.late :]

    def add(i: int, ids: np.ndarray) -> None:
        prompt = TokensPrompt(prompt_token_ids=ids.tolist())
        engine.add_request(f"cal-{comp.label}-{i}", prompt, params)

    for i, ids in enumerate(prompts[: comp.batch - comp.late]):
        add(i, ids)
    timed: list[tuple[BatchShape, float]] = []
    with StepProbe(scheduler_of(llm), record_shapes=True) as probe:
        assert probe.shapes is not None
        while engine.has_unfinished_requests():
            if late and timed and not timed[-1][0].num_prefill_seqs:
                add(comp.batch - len(late), late.pop(0))  # one arrival while others decode
            before = len(probe.shapes)
            t0 = time.perf_counter()
            engine.step()
            dt = time.perf_counter() - t0
            if len(probe.shapes) == before + 1:
                timed.append((probe.shapes[-1], dt))
    samples = [
        Sample(comp.label, "mixed" if shape.num_decode else "prefill", shape, dt)
        for shape, dt in timed
        if shape.num_prefill_seqs
    ]
    decode = [(s, dt) for s, dt in timed if not s.num_prefill_seqs and s.num_decode == comp.batch]
    if decode:
        # The middle step's shape (by order: context grows by one token a step) and the
        # median time of all of them.
        median = statistics.median(dt for _, dt in decode)
        samples.append(Sample(comp.label, "decode", decode[len(decode) // 2][0], median))
    return samples


def median_of_passes(passes: list[list[Sample]]) -> list[Sample]:
    """One sample per (composition, kind, index) present in every pass: the median time.
    Shapes agree across passes (the same prompts are served from an empty cache)."""
    keyed: list[dict[tuple[str, str, int], Sample]] = []
    for samples in passes:
        seen: dict[tuple[str, str], int] = {}
        d = {}
        for smp in samples:
            i = seen[smp.composition, smp.kind] = seen.get((smp.composition, smp.kind), -1) + 1
            d[smp.composition, smp.kind, i] = smp
        keyed.append(d)
    return [
        Sample(key[0], key[1], first.shape, statistics.median(d[key].seconds for d in keyed))
        for key, first in keyed[0].items()
        if all(key in d for d in keyed[1:])
    ]


def split(samples: list[Sample], every: int) -> tuple[list[Sample], list[Sample]]:
    """Train / held-out by composition: every `every`-th composition is held out."""
    labels = list(dict.fromkeys(s.composition for s in samples))
    held = set(labels[every - 1 :: every]) if every > 1 else set()
    return [s for s in samples if s.composition not in held], [
        s for s in samples if s.composition in held
    ]


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
    fit = _fit(spec, model, samples, tick)
    fit.profile.save(out)
    tick("end-to-end comparison")
    rows = spec.bench_rows if spec.bench_rows is not None else _replayed(runs, fit.profile, model)
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


@dataclass(frozen=True)
class _Fit:
    """A fitted (and stamped) profile with its errors: on the training compositions and on
    the held-out ones the fit never saw."""

    profile: HardwareProfile
    train_mape: float
    train: list[Sample]
    held: list[Sample]
    held_pred: np.ndarray
    held_mape: float

    def report(self, samples: list[Sample], model: ModelProfile) -> dict[str, Any]:
        """The report's fit section: errors overall and by sample kind, every held-out
        sample, and every composition's decode step (the locality table and plot)."""
        return {
            "profile": self.profile.to_dict(),
            "train_mape": round(self.train_mape, 4),
            "heldout_mape": round(self.held_mape, 4),
            "heldout_mape_by_kind": self._mape_by_kind(),
            "samples": {"train": len(self.train), "heldout": len(self.held)},
            "heldout": [
                {
                    "composition": s.composition,
                    "kind": s.kind,
                    "measured_ms": round(s.seconds * 1e3, 3),
                    "predicted_ms": round(float(p) * 1e3, 3),
                }
                for s, p in zip(self.held, self.held_pred)
            ],
            "decode": [
                {
                    "composition": s.composition,
                    "batch": s.shape.num_decode,
                    "heldout": s in self.held,
                    "measured_ms": round(s.seconds * 1e3, 3),
                    "predicted_ms": round(float(p) * 1e3, 3),
                }
                for s, p in zip(samples, predict(self.profile, model, [s.shape for s in samples]))
                if s.kind == "decode"
            ],
        }

    def _mape_by_kind(self) -> dict[str, float]:
        true = np.array([s.seconds for s in self.held])
        return {
            kind: round(mape(self.held_pred[idx], true[idx]), 4)
            for kind in ("decode", "prefill", "mixed")
            if (idx := [i for i, smp in enumerate(self.held) if smp.kind == kind])
        }


def _fit(
    spec: CalibrateSpec, model: ModelProfile, samples: list[Sample], tick: Callable[[str], None]
) -> _Fit:
    """Fit the base profile to the training compositions; price the held-out ones with it."""
    train, held = split(samples, spec.holdout_every)
    tick(f"fitting {len(train)} samples")
    base = load_hardware(spec.base_hardware)
    fit = fit_profile(base, model, [s.shape for s in train], [s.seconds for s in train])
    held_pred = predict(fit.profile, model, [s.shape for s in held])
    held_mape = mape(held_pred, np.array([s.seconds for s in held])) if held else float("nan")
    profile = _stamp(fit.profile, spec, fit.train_mape, len(train), held_mape)
    return _Fit(profile, fit.train_mape, train, held, held_pred, held_mape)


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


def _replayed(
    rows: list[dict[str, Any]], profile: HardwareProfile, model: ModelProfile
) -> list[dict[str, Any]]:
    """The real rows with `replay_pred_s`: the fitted model's time for each run's own steps."""
    cost = StepCostModel(profile, model)
    out = []
    for row in rows:
        shapes = row.pop("step_shapes", None) or []
        out.append({**row, "replay_pred_s": round(sum(map(cost.step_time, shapes)), 4)})
    return out


def _stamp(
    profile: HardwareProfile,
    spec: CalibrateSpec,
    train_mape: float,
    n: int,
    held_mape: float,
) -> HardwareProfile:
    """Name, description and per-field sources that say where the fitted numbers came from."""
    from feather_lab.bench.machine import machine_info

    m = machine_info()
    model = spec.bench.model or "tiny-llama"
    note = (
        f"Fitted by `feather calibrate --engine vllm` on {m['cpu']} ({m['cores']} cores, "
        f"{m['memory_gib']} GiB), vLLM {_vllm_version()}, model {model}, "
        f"{n} step samples; step-time MAPE train {train_mape:.1%}, held-out {held_mape:.1%}"
    )
    return stamp_fitted(profile, note, "vllm-fitted")


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def compare_end_to_end(
    profile: HardwareProfile,
    model,
    bench_spec: VllmBenchSpec,
    rows: list[dict[str, Any]],
    vocab: int,
) -> list[dict[str, Any]]:
    """Simulated vs real output tokens/s for each real row (vllm <-> the sim's fcfs)."""
    from feather_sched.policies.registry import make_policy

    cost = StepCostModel(profile, model)
    out = []
    for row in rows:
        scenario = row.get("scenario")
        wname = row["workload"].split(" (")[0]
        if scenario is None or wname not in bench_spec.workloads:
            continue
        config = EngineConfig(
            max_num_seqs=bench_spec.max_num_seqs,
            max_num_batched_tokens=bench_spec.max_num_batched_tokens,
            block_size=bench_spec.block_size,
            num_kv_blocks=int(row["kv_blocks"]),
            index_chunk_size=bench_spec.block_size,
        )
        requests = engine_workload(wname, vocab, bench_spec.seed, bench_spec.scale)
        policy = "fcfs" if row["policy"] == BASELINE else row["policy"]
        options = bench_spec.policy_options.get(policy, {})
        sim = simulate(requests, make_policy(policy, **options), cost, config).summary()
        real = float(row["output_tok_s"])
        out.append(
            {
                "workload": row["workload"],
                "policy": row["policy"],
                "real_tok_s": real,
                "sim_tok_s": sim["output_tok_s"],
                "sim_over_real": round(sim["output_tok_s"] / real, 3) if real else None,
                "real_mean_batch": row.get("mean_batch"),
                "sim_mean_batch": sim["mean_batch"],
                "real_steps": row.get("steps"),
                "sim_steps": sim["steps"],
                # The step model on the real run's own steps vs their measured time: the
                # cost model's share of the end-to-end error (the rest is scheduling).
                "replay_over_busy": round(row["replay_pred_s"] / row["busy_s"], 3)
                if row.get("replay_pred_s") and row.get("busy_s")
                else None,
            }
        )
    return out
