"""`feather calibrate --engine vllm`: fit the step-time model to a real vLLM engine.

1. Measure. For each composition (batch size, distinct prefixes, prefix and suffix lengths) a
   fresh batch is served on an in-process engine with ample KV; every engine iteration is
   timed (`LLMEngine.step`, wall clock) and paired with its exact BatchShape, read from
   vLLM's block tables at scheduling time (`KVCacheManager.get_block_ids`: requests sharing a
   prefix hold the same physical blocks, so sharing is measured, not assumed). Decode steps
   of one composition are near-identical, so they collapse to one sample (median time);
   every step that prefills is its own sample.
2. Fit `HardwareProfile.FIT_FIELDS` on the training compositions (`calibrate_fit`), starting
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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from feather_sched.bench.calibrate_fit import fit_profile, mape, predict
from feather_sched.bench.vllm_engine import (
    BASELINE,
    ENGINE_SCALES,
    KvScenario,
    VllmBenchSpec,
    engine_env_defaults,
    engine_workload,
    make_llm,
    median_rows,
    model_dir,
    open_engines,
    require_vllm,
    run_repetition,
    scheduler_of,
    step_shape,
)
from feather_sched.sim.config import EngineConfig
from feather_sched.sim.cost import (
    BatchShape,
    HardwareProfile,
    ModelProfile,
    StepCostModel,
    load_hardware,
)
from feather_sched.sim.cost import load_model as load_model_profile
from feather_sched.sim.engine import simulate


@dataclass(frozen=True)
class Composition:
    batch: int
    prefixes: int
    prefix_len: int
    suffix_len: int
    decode_steps: int = 16
    late: int = 0
    """Requests held back and added one per step once the others decode: mixed steps
    (decodes plus one prefill), the shape of most steps of a busy server."""
    grouped: bool = False
    """Requests of one prefix adjacent in the batch (as prefix-grouped admission leaves
    them) instead of interleaved round-robin (as a shuffled queue leaves them): a kernel
    that walks the batch in order re-reads a prefix while it is still in cache."""

    @property
    def label(self) -> str:
        late = f"-L{self.late}" if self.late else ""
        order = "-grouped" if self.grouped and self.prefixes > 1 else ""
        return f"B{self.batch}-G{self.prefixes}-P{self.prefix_len}-S{self.suffix_len}{late}{order}"

    def prefix_of(self, i: int) -> int:
        """Which prefix request i carries."""
        return i * self.prefixes // self.batch if self.grouped else i % self.prefixes


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


@dataclass(frozen=True)
class CalibrateSpec:
    model: str | None = None
    base_hardware: str = "cpu"
    model_profile: str | None = None
    """Model profile (name or JSON) for the cost model; None: the built-in model's own."""
    block_size: int = 32
    max_model_len: int | None = None
    """None: the model scale's (`vllm_engine.ENGINE_SCALES`)."""
    max_num_batched_tokens: int = 4096
    kv_blocks: int | None = None
    """KV blocks of the grid's engine; None: the scale's largest scenario."""
    holdout_every: int = 4
    repeats: int = 5
    """Passes over the composition grid; each sample's time is the median over passes."""
    quick: bool = False
    seed: int = 0
    compare_workloads: Sequence[str] | None = None
    """None: the scale's default workloads."""
    compare_policies: Sequence[str] = ("grouped", "feather")
    compare_scenarios: Sequence[KvScenario] | None = None
    compare_repeats: int = 3
    policy_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Options of the compared policies (e.g. feather's step-cost prior)."""
    bench_rows: list[dict[str, Any]] | None = field(default=None, compare=False)
    """Real-engine rows from `feather bench --engine vllm` to compare with (None: run them)."""


class _ShapeProbe:
    """Records the BatchShape of every step the live scheduler schedules."""

    def __init__(self, sched) -> None:
        self.sched = sched
        self.shapes: list[BatchShape] = []
        self._schedule = sched.schedule
        sched.schedule = self._on_schedule

    def _on_schedule(self, *args, **kwargs):
        out = self._schedule(*args, **kwargs)
        if out.num_scheduled_tokens:
            self.shapes.append(step_shape(self.sched, out))
        return out

    def close(self) -> None:
        del self.sched.schedule


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
    probe = _ShapeProbe(scheduler_of(llm))
    timed: list[tuple[BatchShape, float]] = []
    try:
        while engine.has_unfinished_requests():
            if late and timed and not timed[-1][0].num_prefill_seqs:
                add(comp.batch - len(late), late.pop(0))  # one arrival while others decode
            before = len(probe.shapes)
            t0 = time.perf_counter()
            engine.step()
            dt = time.perf_counter() - t0
            if len(probe.shapes) == before + 1:
                timed.append((probe.shapes[-1], dt))
    finally:
        probe.close()
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
    bench_spec = VllmBenchSpec(
        workloads=spec.compare_workloads,
        policies=spec.compare_policies,
        model=spec.model,
        scenarios=spec.compare_scenarios,
        block_size=spec.block_size,
        max_model_len=spec.max_model_len,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        repeats=1,
        seed=spec.seed,
        policy_options=spec.policy_options,
    )
    bench_spec.validate()
    bench_spec = bench_spec.resolved()
    builtin = spec.model is None or spec.model in ENGINE_SCALES
    if spec.model_profile is None and not builtin:
        raise ValueError("--model DIR needs --model-profile (a model profile name or JSON file)")
    model = load_model_profile(spec.model_profile or spec.model or "tiny-llama")
    path, dtype, vocab = model_dir(bench_spec, cache)
    samples, runs = _measure(spec, bench_spec, path, dtype, vocab, tick)
    train, held = split(samples, spec.holdout_every)
    tick(f"fitting {len(train)} samples")
    base = load_hardware(spec.base_hardware)
    fit = fit_profile(base, model, [s.shape for s in train], [s.seconds for s in train])
    held_pred = predict(fit.profile, model, [s.shape for s in held])
    held_true = np.array([s.seconds for s in held])
    held_mape = mape(held_pred, held_true) if held else float("nan")
    profile = _stamp(fit.profile, spec, fit.train_mape, len(train), held_mape)
    profile.save(out)
    tick("end-to-end comparison")
    rows = spec.bench_rows if spec.bench_rows is not None else _replayed(runs, profile, model)
    e2e = compare_end_to_end(profile, model, bench_spec, rows, vocab)
    return {
        "profile_path": str(out),
        "profile": profile.to_dict(),
        "train_mape": round(fit.train_mape, 4),
        "heldout_mape": round(held_mape, 4),
        "heldout_mape_by_kind": {
            kind: round(mape(held_pred[idx], held_true[idx]), 4)
            for kind in ("decode", "prefill", "mixed")
            if (idx := [i for i, smp in enumerate(held) if smp.kind == kind])
        },
        "samples": {"train": len(train), "heldout": len(held)},
        "heldout": [
            {
                "composition": s.composition,
                "kind": s.kind,
                "measured_ms": round(s.seconds * 1e3, 3),
                "predicted_ms": round(float(p) * 1e3, 3),
            }
            for s, p in zip(held, held_pred)
        ],
        "decode": [  # every composition's decode step, the locality table and plot
            {
                "composition": s.composition,
                "batch": s.shape.num_decode,
                "heldout": s in held,
                "measured_ms": round(s.seconds * 1e3, 3),
                "predicted_ms": round(float(p) * 1e3, 3),
            }
            for s, p in zip(samples, predict(profile, model, [s.shape for s in samples]))
            if s.kind == "decode"
        ],
        "end_to_end": e2e,
        "spec": {k: v for k, v in asdict(spec).items() if k != "bench_rows"},
    }


def _measure(
    spec: CalibrateSpec,
    bench_spec: VllmBenchSpec,
    path: str,
    dtype: str,
    vocab: int,
    tick: Callable[[str], None],
) -> tuple[list[Sample], list[dict[str, Any]]]:
    """Grid passes (the median over passes makes each sample) interleaved with repetitions
    of the real bench runs, so both see the same load: on a shared machine the speed of the
    same step drifts by tens of percent over minutes. Returns (samples, real-run rows with
    their step shapes); all engines stay alive to the end (see `open_engines`)."""
    blocks = spec.kv_blocks or max(sc.num_blocks for sc in bench_spec.scenarios)
    cal = make_llm(bench_spec, path, dtype, blocks, feather=False)
    grid = GRIDS.get(spec.model or "tiny-llama", GRIDS["tiny-llama"])
    comps = default_compositions(spec.quick, grid)
    measure(cal, Composition(4, 1, 64, 16, 4), vocab, spec.seed)  # warm-up, discarded
    passes: list[list[Sample]] = []

    def grid_pass() -> None:
        samples: list[Sample] = []
        for i, comp in enumerate(comps):
            tick(f"pass {len(passes) + 1}: {comp.label} ({i + 1}/{len(comps)})")
            samples += measure(cal, comp, vocab, spec.seed + i)
        passes.append(samples)

    rows: list[dict[str, Any]] = []
    alive = [cal]  # no engine may be collected while another still runs
    if spec.bench_rows is None:
        workloads = {
            w: engine_workload(w, vocab, spec.seed, bench_spec.scale) for w in bench_spec.workloads
        }
        for scenario in bench_spec.scenarios:
            engines = open_engines(bench_spec, scenario, path, dtype, vocab)
            alive.append(engines)
            runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for rep in range(spec.compare_repeats):
                grid_pass()
                for key, row in run_repetition(
                    bench_spec, scenario, engines, workloads, rep, tick, record_shapes=True
                ):
                    runs.setdefault(key, []).append(row)
            rows += median_rows(scenario, runs)
    while len(passes) < spec.repeats:
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
    from feather_sched.bench.machine import machine_info

    m = machine_info()
    note = (
        f"Fitted by `feather calibrate --engine vllm` on {m['cpu']} ({m['cores']} cores, "
        f"{m['memory_gib']} GiB), vLLM {_vllm_version()}, model {spec.model or 'tiny-llama'}, "
        f"{n} step samples; step-time MAPE train {train_mape:.1%}, held-out {held_mape:.1%}"
    )
    sources = dict(profile.sources)
    for name in HardwareProfile.FIT_FIELDS:
        sources[name] = note
    return profile.replace(
        name=f"{profile.name}-vllm-fitted",
        description=f"{note}. Peak figures from the {profile.name!r} profile.",
        sources=sources,
    )


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
