"""`feather bench`: run policies x workloads in the simulator, collect comparable rows."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feather_lab.bench.context import fit_context
from feather_lab.bench.oracle import default_caps, oracle_sweep
from feather_lab.bench.report import add_relative
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.sim.result import SLO
from feather_lab.sim.scheduler_cpu import check_mode, load_scheduler_cpu
from feather_lab.workloads.arrivals import parse_arrival
from feather_lab.workloads.presets import PRESETS, Preset
from feather_lab.workloads.presets import build_workload as build_workload
from feather_lab.workloads.registry import TRACE_PREFIX, WORKLOADS, make_workload
from feather_sched.cost.resolve import prior_cost, resolve_cost
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.base import Policy
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.registry import make_policy, policy_names
from feather_sched.request import Request

SUITE: dict[str, Preset] = PRESETS["sim"]
"""The built-in suite: its workloads by name (`workloads.presets`, scale "sim")."""
DEFAULT_WORKLOADS = list(SUITE)
DEFAULT_POLICIES = [
    "fcfs",
    "vllm-cache-aware",
    "lpm",
    "dfs-weight",
    "lof",
    "random",
    "max-homogeneous",
    "feather",
    "feather-paper",
    "feather-upstream",
    "feather-ppo",
    "oracle",
]
BASELINE = "fcfs"
DEFAULT_HARDWARE = "h200"
"""The measured profile (benchmarks/gpu/README.md): the main job stands on measured ground."""
BOUNDS = frozenset({"oracle", "max-homogeneous"})
"""Rows that are references, not deployable policies (plots draw them apart)."""
MAX_ARRIVAL_SPAN_S = 30 * 24 * 3600.0
"""A workload whose arrivals span more than this (30 days) is refused: almost surely a
timestamp in the wrong unit, and its throughput would read as 0."""
MAX_KV_BLOCKS = 1 << 22
"""Most KV blocks the simulator is asked to manage (it keeps state per block)."""


@dataclass(frozen=True)
class BenchCosts:
    """A bench's cost models (`BenchSpec.costs`): checked before any run, then shared by
    every run (a cost model keeps no state)."""

    run: StepCostModel
    """The simulated engine's step times."""
    feather: StepCostModel | None
    """The `feather` policy's prior (None: none, or feather does not run)."""


@dataclass(frozen=True)
class BenchSpec:
    workloads: Sequence[str] = tuple(DEFAULT_WORKLOADS)
    policies: Sequence[str] = tuple(DEFAULT_POLICIES)
    hardware: str = DEFAULT_HARDWARE
    model: str = "llama-3.1-8b"
    kernel: str = "paged"
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    engine_overrides: frozenset[str] = frozenset()
    """Engine fields the user set explicitly; they win over a workload's own settings."""
    policy_state: Path | None = None
    """The `feather` bandit's table: loaded before the runs if the file exists (warm start),
    saved after them; one bandit then learns across all workloads, as a deployment would."""
    feather_hardware: str | None = None
    """Hardware profile `feather` takes as its step-cost prior: None, the bench's own (a
    calibrated deployment); "none", no prior; any other, a mismatched model."""
    drop_overlong: bool = False
    """Drop requests longer than the model's context (counted in the row) instead of
    refusing the run (`bench.context`)."""
    arrival: str | None = None
    """Arrival process of the generated workloads (`all`, `poisson:RATE`,
    `bursts:SIZE:INTERVAL`); None keeps each workload's own. Not for traces."""
    rate_scale: float | None = None
    """Multiplies the request rate: every arrival time is divided by it."""
    limit: int | None = None
    """Keep only each workload's first `limit` requests (by arrival)."""
    slo: SLO = field(default_factory=SLO)
    """Goodput counts the requests that meet it."""
    steps_out: Path | None = None
    """A JSONL step log (`bench.steplog`): one line per simulated step of every run."""
    scheduler_cpu: str = "model"
    """The scheduler's CPU on the simulated clock (`sim.sched_cpu`): `model` (fitted from
    SGLang's own code, `cost.scheduler_cpu`), `measured` or `off`; hidden under the step up
    to its GPU time, as the engines' default async/overlap loops do."""
    rates: tuple[float, ...] | None = None
    """A latency-throughput sweep: each workload run at each of these request rates
    (requests/s; Poisson arrivals for generated workloads, the trace's own timestamps
    rescaled to that mean rate for a trace), one row set per (workload, rate)."""

    def feather_cost(self) -> StepCostModel | None:
        """Feather's step-cost prior by `--feather-hardware`'s one rule (`prior_cost`: unset,
        the bench's own hardware; "none", no prior: None), with the bench's model and kernel."""
        return prior_cost(self.feather_hardware, self.hardware, self.model, self.kernel)

    def costs(self) -> BenchCosts:
        """The bench's cost models, each resolved once from its names (a ValueError names a
        bad one): the simulated engine's, and feather's prior when feather runs."""
        run = resolve_cost(self.hardware, self.model, self.kernel)
        return BenchCosts(run, self.feather_cost() if "feather" in self.policies else None)

    def validate(self) -> None:
        """Every option checked before anything runs; a ValueError names the bad value."""
        known = {*policy_names(), "oracle"}
        bad = [p for p in self.policies if p not in known]
        if bad:
            raise ValueError(f"unknown policies {bad}; valid: {', '.join(sorted(known))}")
        if not self.policies:
            raise ValueError(f"no policies to run; valid: {', '.join(sorted(known))}")
        dup = sorted({p for p in self.policies if list(self.policies).count(p) > 1})
        if dup:
            raise ValueError(f"policies named twice: {', '.join(dup)}")
        if not self.workloads:
            raise ValueError("no workloads to run")
        if self.arrival is not None:
            parse_arrival(self.arrival)
            traces = [w for w in self.workloads if w.startswith(TRACE_PREFIX)]
            if traces:
                raise ValueError(
                    f"--arrival {self.arrival!r} applies to generated workloads, not to "
                    f"{traces[0]!r} (a trace keeps its own timestamps; use --rate-scale)"
                )
        if self.rate_scale is not None and not (
            math.isfinite(self.rate_scale) and self.rate_scale > 0
        ):
            raise ValueError(f"--rate-scale must be a finite number > 0, got {self.rate_scale}")
        if self.rates is not None:
            if not self.rates or not all(math.isfinite(r) and r > 0 for r in self.rates):
                raise ValueError(
                    f"--rates must be finite request rates > 0, got {list(self.rates)}"
                )
            if self.arrival is not None or self.rate_scale is not None:
                raise ValueError("--rates sets the arrivals: drop --arrival / --rate-scale")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be an integer >= 1, got {self.limit}")
        for name, value in (("--slo-ttft", self.slo.ttft_s), ("--slo-tpot", self.slo.tpot_s)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value}")
        self.check_scheduler_cpu()
        blocks = self.engine.num_kv_blocks
        if blocks is not None and not (1 <= blocks <= MAX_KV_BLOCKS):
            raise ValueError(
                f"--num-kv-blocks must be between 1 and {MAX_KV_BLOCKS:,}, got {blocks:,}"
            )

    def engine_for(self, workload: str) -> EngineConfig:
        """The engine settings for one workload: the suite's needs, then explicit options
        (the scheduler CPU mode is the bench's)."""
        suite = SUITE.get(workload)
        own = suite.engine if suite is not None else {}
        changes = {k: v for k, v in own.items() if k not in self.engine_overrides}
        return dataclasses.replace(self.engine, scheduler_cpu=self.scheduler_cpu, **changes)

    def check_scheduler_cpu(self) -> None:
        """`--scheduler-cpu` names a mode, and under `model` every policy has a CPU row (the
        oracle runs grouped)."""
        check_mode(self.scheduler_cpu)
        if self.scheduler_cpu == "model":
            model = load_scheduler_cpu()
            for name in self.policies:
                model.for_policy("grouped" if name == "oracle" else name)

    def total_runs(self) -> int:
        n = 0
        for w in self.workloads:
            n += len(self.policies) + len(_preset_bounds(w))
            if "oracle" in self.policies:
                n += len(default_caps(self.engine_for(w).max_num_seqs)) - 1
        return n * (len(self.rates) if self.rates else 1)


def _params(workload: Any) -> dict[str, Any]:
    """A workload's every parameter, as JSON values (arrival as its spec string)."""
    out: dict[str, Any] = {"generator": type(workload).__name__}
    for f in dataclasses.fields(workload):
        value = getattr(workload, f.name)
        if hasattr(value, "spec") and not isinstance(value, (str, int, float)):
            value = value.spec
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def _at_rate(requests: list[Request], rate: float) -> tuple[list[Request], float]:
    """A trace's requests rescaled to a mean rate of `rate` requests/s; the scale used."""
    if len(requests) < 2 or requests[-1].arrival_time <= requests[0].arrival_time:
        raise ValueError("--rates on a trace needs at least two distinct arrival times to rescale")
    own = (len(requests) - 1) / (requests[-1].arrival_time - requests[0].arrival_time)
    scale = rate / own
    t0 = requests[0].arrival_time
    return [
        dataclasses.replace(r, arrival_time=t0 + (r.arrival_time - t0) / scale) for r in requests
    ], scale


def build_bench_workload(
    name: str,
    spec: BenchSpec,
    apply_limit: bool = True,
    rate: float | None = None,
    scale: str = "sim",
    vocab_size: int | None = None,
) -> tuple[list[Request], dict[str, Any]]:
    """A bench workload's requests (arrival, rate scale and, unless told not to, limit
    applied) and every parameter it was built with. Names: the presets of `scale` (the
    suite, `SUITE`, by default; an engine model's for `feather replay`), any generator,
    `trace:PATH`. `vocab_size` sets a generated workload's token ids (a server's vocabulary)."""
    limit = spec.limit if apply_limit else None
    presets = PRESETS[scale]
    preset = presets.get(name)
    if preset is None and not name.startswith(TRACE_PREFIX) and name not in WORKLOADS:
        valid = ", ".join([*presets, *(w for w in WORKLOADS if w not in presets)])
        raise ValueError(f"unknown workload {name!r}; valid names: {valid}, or 'trace:PATH'")
    base, overrides = (preset.base, dict(preset.overrides)) if preset else (name, {})
    is_trace = name.startswith(TRACE_PREFIX)
    if vocab_size is not None and not is_trace:
        overrides["vocab_size"] = vocab_size
    arrival = f"poisson:{rate!r}" if rate is not None and not is_trace else spec.arrival
    if arrival is not None and not is_trace:
        overrides["arrival"] = parse_arrival(arrival)
        try:
            workload = make_workload(base, **overrides)
        except ValueError as err:
            if "no field(s) arrival" not in str(err):
                raise
            raise ValueError(
                f"workload {name!r} has no arrival process to set (arrivals {arrival})"
            ) from None
    elif name.startswith(TRACE_PREFIX) and limit is not None:
        workload = make_workload(base, limit=limit, **overrides)
    else:
        workload = make_workload(base, **overrides)
    requests = sorted(workload.generate(spec.seed), key=lambda r: r.arrival_time)
    if limit is not None:
        requests = requests[:limit]
    if spec.rate_scale is not None and spec.rate_scale != 1:
        t0 = requests[0].arrival_time if requests else 0.0
        requests = [
            dataclasses.replace(r, arrival_time=t0 + (r.arrival_time - t0) / spec.rate_scale)
            for r in requests
        ]
    params = {
        **_params(workload),
        "limit": spec.limit,
        "rate_scale": spec.rate_scale,
        "requests": len(requests),
    }
    if rate is not None:
        params["rate_req_s"] = rate
        if is_trace:
            requests, params["rate_scale"] = _at_rate(requests, rate)
    return requests, params


def check_requests(name: str, requests: Sequence[Request], kv_blocks: int, block_size: int) -> None:
    """Inputs the simulator cannot give a meaningful result for, refused before any run:
    no requests, arrivals that are not finite or span more than `MAX_ARRIVAL_SPAN_S`, and a
    request whose prompt + output cannot fit the KV cache even alone."""
    if not requests:
        raise ValueError(f"workload {name!r} has no requests (an empty trace, or --limit 0?)")
    times = [r.arrival_time for r in requests]
    if not all(math.isfinite(t) and t >= 0 for t in times):
        bad = next(t for t in times if not (math.isfinite(t) and t >= 0))
        raise ValueError(f"workload {name!r}: arrival time {bad} is not a finite time >= 0")
    span = max(times) - min(times)
    if span > MAX_ARRIVAL_SPAN_S:
        shown = f"{span:,.0f} s ({span / 86400:,.0f} days)" if span < 1e12 else f"{span:.3g} s"
        raise ValueError(
            f"workload {name!r}: arrivals span {shown}, over "
            f"the {MAX_ARRIVAL_SPAN_S / 86400:.0f}-day limit; are the timestamps in the "
            "right unit (Mooncake: milliseconds; feather JSONL: seconds)? --rate-scale "
            "compresses them"
        )
    worst = max(requests, key=lambda r: r.prompt_len + r.output_len)
    need = -(-(worst.prompt_len + worst.output_len) // block_size)
    if need > kv_blocks:
        raise ValueError(
            f"workload {name!r}: request {worst.request_id!r} needs {need:,} KV blocks "
            f"({worst.prompt_len:,} prompt + {worst.output_len:,} output tokens, "
            f"{block_size} per block) but the KV cache has {kv_blocks:,}; raise "
            "--num-kv-blocks (or leave it unset: sized from the hardware memory), or use "
            "--limit / a smaller model"
        )


def _first_closed(requests: list[Request], n: int) -> list[Request]:
    """The first n requests by arrival (a later turn never precedes its parent, so no
    dependency is cut)."""
    return sorted(requests, key=lambda r: r.arrival_time)[:n]


def fitted_workload(
    name: str,
    spec: BenchSpec,
    context: int,
    model: str,
    rate: float | None = None,
    scale: str = "sim",
    vocab_size: int | None = None,
) -> tuple[list[Request], int, dict[str, Any]]:
    """A workload built (`build_bench_workload`) and fitted to a `context` of tokens
    (`fit_context`): its requests, how many were dropped as overlong, its parameters. With
    --drop-overlong, --limit counts the requests kept: the first N that fit."""
    original, params = build_bench_workload(
        name, spec, not spec.drop_overlong, rate, scale, vocab_size
    )
    requests, dropped = fit_context(original, context, spec.drop_overlong, f"{name} on {model}")
    if spec.drop_overlong and spec.limit is not None and len(requests) > spec.limit:
        kept = _first_closed(requests, spec.limit)
        last = kept[-1].arrival_time
        # dropped counts the overlong ones among the first requests, as if cut first
        window = sum(1 for r in original if r.arrival_time <= last)
        requests, dropped = kept, max(0, window - len(kept))
        params["requests"] = len(requests)
    return requests, dropped, params


@dataclass
class PreparedWorkload:
    requests: list[Request]
    dropped: int
    params: dict[str, Any]
    base: str = ""
    """The workload's name in the suite (the key adds `@RATE/s` in a sweep)."""
    rate: float | None = None


def prepare_workloads(spec: BenchSpec, cost: StepCostModel) -> dict[str, PreparedWorkload]:
    """Every workload built and checked before any run starts (all errors up front)."""
    spec.validate()
    limit = cost.model.max_context_tokens
    prepared: dict[str, PreparedWorkload] = {}
    for wname, rate in [(w, r) for w in spec.workloads for r in (spec.rates or (None,))]:
        key = wname if rate is None else f"{wname}@{rate:g}/s"
        requests, dropped, params = fitted_workload(wname, spec, limit, spec.model, rate)
        engine = spec.engine_for(wname)
        if engine.max_num_batched_tokens < engine.max_num_seqs:
            raise ValueError(
                f"--max-batched-tokens {engine.max_num_batched_tokens} is below max_num_seqs "
                f"{engine.max_num_seqs} for workload {wname!r}; vLLM refuses this too "
                "(max_num_batched_tokens >= max_num_seqs): raise it or lower --max-num-seqs"
            )
        check_requests(
            wname, requests, engine.kv_blocks(cost.hardware, cost.model), engine.block_size
        )
        params["max_num_seqs"] = engine.max_num_seqs
        prepared[key] = PreparedWorkload(requests, dropped, params, wname, rate)
    unscaled = unscaled_workloads(spec, prepared)
    if unscaled and len(unscaled) == len(prepared):
        raise ValueError(
            f"--rate-scale {spec.rate_scale:g} changes nothing: every request of "
            f"{', '.join(unscaled)} arrives at the same time; give generated workloads "
            "arrivals to scale (--arrival poisson:RATE or bursts:SIZE:INTERVAL), or a trace"
        )
    return prepared


def unscaled_workloads(spec: BenchSpec, prepared: dict[str, PreparedWorkload]) -> list[str]:
    """The workloads `--rate-scale` leaves as they were: all their requests arrive at once."""
    if spec.rate_scale is None or spec.rate_scale == 1:
        return []
    return [k for k, p in prepared.items() if len({r.arrival_time for r in p.requests}) < 2]


def run_bench(
    spec: BenchSpec,
    on_progress: Callable[[str], None] | None = None,
    on_rows: Callable[[list[dict]], None] | None = None,
    on_sim: Callable[[str, int, int], None] | None = None,
    prepared: dict[str, PreparedWorkload] | None = None,
    rows: list[dict] | None = None,
    costs: BenchCosts | None = None,
) -> list[dict]:
    """Simulate every (workload, policy) pair; one summary row each.

    `on_rows` gets each workload's rows as soon as they are done (with `vs_fcfs`);
    `on_sim(label, finished, total)` reports inside a run; `rows`, when given, is filled
    in place, so a caller keeps the finished rows if the bench is interrupted; `prepared`
    and `costs`, when given, are what the caller already built and checked.
    """
    costs = costs if costs is not None else spec.costs()
    cost = costs.run
    workloads = prepared if prepared is not None else prepare_workloads(spec, cost)
    tick = on_progress or (lambda _label: None)
    rows = rows if rows is not None else []
    shared_feather = None
    if spec.policy_state is not None and "feather" in spec.policies:
        warm = spec.policy_state.is_file()
        shared_feather = FeatherPolicy(
            policy_state=spec.policy_state if warm else None, cost=costs.feather
        )
    steps_file = spec.steps_out.open("w") if spec.steps_out is not None else None
    try:
        for wname, prepared_workload in workloads.items():
            start = len(rows)  # each run's row lands in `rows` as soon as it is done
            _run_workload(
                spec,
                cost,
                wname,
                prepared_workload,
                lambda: shared_feather or make_policy("feather", cost=costs.feather),
                tick,
                on_sim,
                steps_file,
                rows,
            )
            done = rows[start:]
            add_relative(done, BASELINE)
            if on_rows is not None:
                on_rows(done)
    finally:
        if steps_file is not None:
            steps_file.close()
    if shared_feather is not None and spec.policy_state is not None:
        shared_feather.save(spec.policy_state)
    return rows


def _run_workload(
    spec: BenchSpec,
    cost: StepCostModel,
    wname: str,
    prepared: PreparedWorkload,
    make_feather: Callable[[], Policy],
    tick: Callable[[str], None],
    on_sim: Callable[[str, int, int], None] | None,
    steps_file: Any,
    rows: list[dict],
) -> None:
    """Every policy on one workload: a row appended to `rows` as each run finishes.
    `make_feather`: the feather policy of a run (the bench's one learning feather with
    `--policy-state`, else a fresh one with the bench's prior)."""
    from feather_lab.bench.steplog import StepRecorder

    requests = prepared.requests
    engine = spec.engine_for(prepared.base or wname)
    for pname in spec.policies:
        label = f"{wname} / {pname}"
        progress = None
        if on_sim is not None:
            progress = lambda done, total, label=label: on_sim(label, done, total)  # noqa: E731
        if pname == "oracle":
            result = oracle_sweep(
                requests,
                cost,
                engine,
                on_run=lambda cap, _r, label=label: tick(f"{label} (cap {cap})"),
            )
        else:
            policy = make_feather() if pname == "feather" else make_policy(pname)
            if steps_file is not None:
                labels = {"workload": wname, "policy": pname}
                policy = StepRecorder(policy, steps_file, labels)
            result = simulate(requests, policy, cost, engine, progress=progress)
            tick(label)
        rows.append(_bench_row(spec, wname, prepared, engine, result.summary(spec.slo)))
    if UNBOUNDED_KV in _preset_bounds(prepared.base or wname):
        rows.append(_unbounded_kv_row(spec, cost, wname, prepared, engine))
        tick(f"{wname} / {UNBOUNDED_KV}")


UNBOUNDED_KV = "bound:unbounded-kv"
"""A limit row: the engine's own order (fcfs) with a KV cache that holds every request of the
run at once (no eviction, no preemption), so the table shows how far each policy is from
what memory allows. Left out of best-of-run comparisons (`output.is_bound_row`)."""


def _preset_bounds(name: str) -> tuple[str, ...]:
    preset = SUITE.get(name)
    return preset.bounds if preset is not None else ()


def _unbounded_kv_row(
    spec: BenchSpec,
    cost: StepCostModel,
    wname: str,
    prepared: PreparedWorkload,
    engine: EngineConfig,
) -> dict:
    bs = engine.block_size
    need = sum(-(-(r.prompt_len + r.output_len) // bs) for r in prepared.requests)
    unbounded = dataclasses.replace(engine, num_kv_blocks=min(MAX_KV_BLOCKS, need + 1))
    result = simulate(prepared.requests, make_policy(BASELINE), cost, unbounded)
    summary = {**result.summary(spec.slo), "policy": UNBOUNDED_KV}
    return _bench_row(spec, wname, prepared, engine, summary)


def _bench_row(
    spec: BenchSpec,
    wname: str,
    prepared: PreparedWorkload,
    engine: EngineConfig,
    summary: dict,
) -> dict:
    """One run's row: its workload, the engine's batch cap, the run's summary, the requests
    dropped as overlong and, in a sweep, the rate."""
    row = {
        "workload": wname,
        "max_num_seqs": engine.max_num_seqs,
        **summary,
        "dropped_overlong": prepared.dropped,
    }
    if prepared.rate is not None:
        row["rate_req_s"] = prepared.rate
    return row
