"""`feather probe`: time decode steps over the composition grid, fit the hardware profile, write
the results.

For each composition (batch, distinct prefixes, prefix length) the random-weight decoder runs
whole decode steps and, separately, every layer's attention alone; each time is the median (a
CPU: the fastest) of `reps` runs after `warmup`. Writes the fitted profile (PROFILE.json, for
`feather bench --hardware`), the results (RESULTS.json) and a plot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from feather_lab.bench.machine import machine_info, write_json
from feather_lab.bench.record import write_record
from feather_lab.probe.device import device_info, kv_plan
from feather_lab.probe.fit import fit_rows
from feather_lab.probe.layout import GRIDS, build_layout
from feather_lab.probe.spec import ProbeSpec, torch_dtype
from feather_lab.probe.timing import stat_of, statistic, time_runs
from feather_sched.cost import HardwareProfile, load_model
from feather_sched.cost.composition import Composition


@dataclass
class _Session:
    """One probe run's instruments and what it has measured so far."""

    spec: ProbeSpec
    info: dict[str, Any]
    decoder: Any
    kernels: dict[str, Any]
    reps: int
    warmup: int
    budget: float | None
    how: str
    t_start: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    shapes: dict[str, Any] = field(default_factory=dict)
    notes: set[str] = field(default_factory=set)
    failed: list[str] = field(default_factory=list)
    stopped_at: str | None = None


def run_probe(
    spec: ProbeSpec,
    out: Path | None = None,
    json_out: Path | None = None,
    plot: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure, fit, write `out` (profile), `json_out` (results) and `plot`; the report."""
    import torch

    t_start = time.perf_counter()
    session, model, cost_model, dtype, comps, plan = _start(spec, log, t_start)
    with torch.inference_mode():
        for kname, attn in session.kernels.items():
            for i, comp in enumerate(comps):
                if session.budget is not None and time.perf_counter() - t_start > session.budget:
                    session.stopped_at = f"{kname} {comp.label}"
                    log(f"time budget spent: stopped before {session.stopped_at}")
                    break
                _measure(session, kname, attn, i, comp, len(comps), log)
                if json_out is not None:  # what is measured so far survives a killed run
                    partial = {"device": session.info, "rows": session.rows}
                    write_json(Path(f"{json_out}.partial"), partial)
    measured_s = time.perf_counter() - t_start
    first = next(iter(session.kernels))
    if len({r["composition"] for r in session.rows if r["kernel"] == first}) < 3:
        raise RuntimeError(
            f"only {len(session.rows)} composition(s) measured, too few to fit; "
            f"failures: {session.failed}"
        )
    fitted = fit_rows(spec, session.info, cost_model, session.rows, session.shapes, first)
    report = {
        "machine": machine_info(),
        "device": session.info,
        "config": _report_config(session, model, dtype, plan, measured_s),
        **fitted,
    }
    _write_outputs(report, out, json_out, plot)
    return report


def _start(spec: ProbeSpec, log: Callable[[str], None], t_start: float):
    """Checks, the device, the model at the dtype that runs, the compositions that fit, the
    decoder and the kernels: the session, the model, the cost model, the dtype, the
    compositions and the KV plan (skipped, blocks, pools)."""
    import torch

    from feather_lab.probe.attention import kernels as available_kernels
    from feather_lab.probe.decoder import RandomDecoder

    if spec.device not in ("cuda", "cpu"):
        raise ValueError(f"--device must be cuda or cpu, got {spec.device!r}")
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch sees no CUDA device")
    torch.manual_seed(spec.seed)
    if spec.device == "cpu":
        torch.set_num_threads(spec.threads or 1)
    info = device_info(spec.device)
    dtype = torch_dtype(spec)
    elem = torch.empty((), dtype=dtype).element_size()
    model = load_model(spec.resolved_model())
    # The cost model prices bytes at the dtype actually run (float32 on a CPU).
    cost_model = model.replace(dtype_bytes=elem, kv_dtype_bytes=None)
    if spec.compositions is None and spec.grid_name() not in GRIDS:
        raise ValueError(f"unknown grid {spec.grid_name()!r}; grids: {', '.join(GRIDS)}")
    comps = spec.compositions or GRIDS[spec.grid_name()].compositions()
    comps, skipped, blocks, pools = kv_plan(spec, cost_model, elem, comps)
    for label in skipped:
        log(f"skipped (KV does not fit): {label}")
    log(
        f"{info.get('name')}: {model.name} ({dtype}), {len(comps)} compositions, "
        f"{pools} KV pool(s) of {blocks} blocks"
    )
    decoder = RandomDecoder(
        cost_model, spec.device, dtype, blocks, pools, spec.block_size, spec.seed
    )
    session = _Session(
        spec,
        info,
        decoder,
        available_kernels(spec.device, spec.kernels),
        spec.resolved_reps(),
        spec.resolved_warmup(),
        spec.resolved_budget(),
        statistic(spec.device),
        t_start,
    )
    return session, model, cost_model, dtype, comps, (skipped, blocks, pools)


def _measure(
    session: _Session,
    kname: str,
    attn: Any,
    i: int,
    comp: Composition,
    total: int,
    log: Callable[[str], None],
) -> None:
    """Time one composition's decode step and attention alone with one kernel; a row, or a
    failure noted (out of memory, a kernel failing: the probe goes on without it)."""
    import torch

    spec, decoder = session.spec, session.decoder
    layout = build_layout(comp, spec.block_size, seed=spec.seed + i)
    if comp.label not in session.shapes:
        session.shapes[comp.label] = layout.shape()
    b = decoder.batch(layout, seed=spec.seed + i)
    q = decoder.query(b)
    if getattr(attn, "needs_plan", False):
        attn.plan(q, decoder.pools[0][0], b.block_tables, b.context_lens, decoder.scale)
    graph_ok = spec.cuda_graph and getattr(attn, "graph_safe", True)
    timing = (spec.device, session.warmup, session.reps, graph_ok)
    try:
        step_t, graphed, note = time_runs(lambda b=b: decoder.step(b, attn), *timing)
        attn_t, _, note2 = time_runs(lambda b=b, q=q: decoder.attention_only(b, attn, q), *timing)
    except RuntimeError as err:
        session.failed.append(f"{kname} {comp.label}: {type(err).__name__}: {err}"[:500])
        log(f"failed: {session.failed[-1]}")
        del b, q
        if spec.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        return
    session.notes.update(n for n in (note, note2) if n)
    step_s, attn_s = stat_of(step_t, session.how), stat_of(attn_t, session.how)
    session.rows.append(_row(comp, kname, step_s, attn_s, step_t, graphed, session.shapes))
    log(
        f"{kname} {comp.label}: step {step_s * 1e3:.3f} ms, "
        f"attention {attn_s * 1e3:.3f} ms ({i + 1}/{total})"
    )
    del b, q
    if spec.device == "cuda":
        torch.cuda.empty_cache()


def _row(comp, kname, step_s, attn_s, step_t, graphed, shapes) -> dict[str, Any]:
    shape = shapes[comp.label]
    return {
        "composition": comp.label,
        "kernel": kname,
        "batch": comp.batch,
        "prefixes": comp.prefixes,
        "prefix_len": comp.prefix_len,
        "suffix_len": comp.suffix_len,
        "decode_ms": round(step_s * 1e3, 4),
        "attn_ms": round(attn_s * 1e3, 4),
        "decode_runs_ms": [round(t * 1e3, 4) for t in step_t],
        "cuda_graph": graphed,
        "logical_kv_tokens": shape.logical_kv_tokens,
        "unique_kv_tokens": shape.unique_kv_tokens,
    }


def _report_config(session: _Session, model, dtype, plan, measured_s: float) -> dict[str, Any]:
    """The report's config: the spec as run and how the run went."""
    spec = session.spec
    skipped, blocks, pools = plan
    return {
        **{k: v for k, v in asdict(spec).items() if k != "compositions"},
        "model": model.name,
        "dtype": str(dtype).replace("torch.", ""),
        "grid": spec.grid_name() if spec.compositions is None else "custom",
        "reps": session.reps,
        "warmup": session.warmup,
        "statistic": session.how,
        "budget_s": session.budget,
        "kv_pools": pools,
        "kv_blocks_per_pool": blocks,
        "kernels": list(session.kernels),
        "fitted_kernel": next(iter(session.kernels)),
        "skipped_compositions": skipped,
        "stopped_before": session.stopped_at,
        "failed": session.failed,
        "notes": sorted(session.notes),
        "measure_s": round(measured_s, 1),
    }


def _write_outputs(
    report: dict[str, Any], out: Path | None, json_out: Path | None, plot: Path | None
) -> None:
    """The fitted profile, the JSON report (the partial file then goes) and the plot."""
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        HardwareProfile.from_dict(report["profile"]).save(out)
        report["profile_path"] = str(out)
    if json_out is not None:
        write_record(json_out, **{k: v for k, v in report.items() if k != "machine"})
        Path(f"{json_out}.partial").unlink(missing_ok=True)
    if plot is not None:
        from feather_lab.probe.plot import plot_results

        report["plot"] = plot_results(report, plot)
