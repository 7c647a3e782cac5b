"""A bench's workloads, built and checked before any run.

A workload name (a suite preset, a generator, or `trace:PATH`) becomes its requests with the
bench's arrival, rate scale and limit applied, fitted to the model's context, and is refused
here, with what to change, when the simulator could not give a meaningful result for it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feather_lab.bench.context import fit_context
from feather_lab.workloads.arrivals import parse_arrival
from feather_lab.workloads.presets import PRESETS
from feather_lab.workloads.registry import TRACE_PREFIX, WORKLOADS, make_workload
from feather_sched.cost.step_model import StepCostModel
from feather_sched.request import Request

if TYPE_CHECKING:
    from feather_lab.bench.spec import BenchSpec

MAX_ARRIVAL_SPAN_S = 30 * 24 * 3600.0
"""A workload whose arrivals span more than this (30 days) is refused: almost surely a
timestamp in the wrong unit, and its throughput would read as 0."""


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
