"""Time decode steps over the composition grid, fit the hardware profile, write the results.

1. Measure. For each composition of the grid (batch, distinct prefixes, prefix length) the
   random-weight decoder runs whole decode steps (every layer's matrix products + paged
   attention) and, separately, every layer's attention alone. GPU: CUDA events around a
   CUDA-graph replay of the step (as vLLM replays its decode steps; eager if capture fails);
   CPU: wall clock. Each time is the median of `reps` runs after `warmup` runs.
2. Fit `HardwareProfile.FIT_FIELDS` with `cost.fit` (as `feather calibrate` does)
   on the first kernel's decode steps, paired with each batch's exact BatchShape (from its
   block tables); every `holdout_every`-th composition is held out and priced by the fitted
   model: the held-out MAPE.
3. Write the fitted profile (PROFILE.json, for `feather bench --hardware PROFILE.json`), the
   results (RESULTS.json: machine, config, one row per composition and kernel, the fit and the
   homogeneity summary) and a plot.
"""

from __future__ import annotations

import importlib.metadata
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from feather_lab.bench.machine import machine_info, write_json
from feather_lab.probe.layout import GRIDS, build_layout
from feather_sched.cost import HardwareProfile, ModelProfile, load_hardware, load_model
from feather_sched.cost.composition import Composition
from feather_sched.cost.fit import fit_profile, mape, predict, stamp_fitted

DEFAULT_MODEL = {"cuda": "llama-3-8b", "cpu": "kv-bound"}
"""Model whose shapes the probe builds: Llama-3-8B on a GPU; on a CPU the kv-bound model (the
real-engine model of the paper's effect on a CPU, 4 KiB of KV per token per layer)."""


@dataclass
class ProbeSpec:
    device: str = "cuda"
    model: str | None = None
    """Model profile (name or JSON); None: DEFAULT_MODEL[device]."""
    quick: bool = False
    base_hardware: str | None = None
    """Hardware profile whose peak figures the fit keeps; None: from the device name."""
    dtype: str | None = None
    """bfloat16 / float16 / float32; None: bfloat16 on cuda, float32 on cpu."""
    block_size: int = 16
    warmup: int | None = None
    """Untimed runs before the timed ones; None: 2 on cuda (after graph capture), 1 on cpu."""
    reps: int | None = None
    """Timed runs per composition; None: 5."""
    holdout_every: int = 4
    cuda_graph: bool = True
    budget_s: float | None = None
    """Stop measuring further compositions after this many seconds (None: no limit)."""
    memory_fraction: float = 0.85
    """Share of free device memory (cuda) or available RAM (cpu) the probe may use."""
    kernels: list[str] | None = None
    """Attention kernels to time (attention.KERNELS); None: by device."""
    grid: str | None = None
    """A grid of layout.GRIDS by name; None: the device's (quick) grid."""
    threads: int | None = None
    """torch CPU threads (--device cpu); None: 1. On a shared 2-core machine torch's two-thread
    ops wait for the core another process holds: 20x slower here (45 ms vs 950 ms for one
    attention call), and the step times are mostly that wait."""
    seed: int = 0
    compositions: list[Composition] | None = field(default=None, repr=False)
    """Override the grid (tests)."""

    def resolved_model(self) -> str:
        return self.model or DEFAULT_MODEL[self.device]

    def resolved_reps(self) -> int:
        return self.reps or 5

    def resolved_warmup(self) -> int:
        return self.warmup if self.warmup is not None else (2 if self.device == "cuda" else 1)

    def resolved_budget(self) -> float | None:
        """`--quick` on a CPU stops after 180 s of measuring (the smoke run stays short on a
        loaded machine); otherwise only an explicit budget."""
        if self.budget_s is None and self.quick and self.device == "cpu":
            return 180.0
        return self.budget_s

    def grid_name(self) -> str:
        return self.grid or self.device + ("-quick" if self.quick else "")


def _torch_dtype(spec: ProbeSpec):
    import torch

    name = spec.dtype or ("bfloat16" if spec.device == "cuda" else "float32")
    try:
        return getattr(torch, name)
    except AttributeError:
        raise ValueError(f"unknown dtype {name!r}") from None


def device_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"device": device, "torch": torch.__version__}
    try:  # the version only: importing triton here would fix its interpret mode for good
        info["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        info["triton"] = None
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(
            name=p.name,
            memory_bytes=int(p.total_memory),
            l2_cache_bytes=int(getattr(p, "L2_cache_size", 0) or 0),
            sm_count=int(p.multi_processor_count),
            capability=f"{p.major}.{p.minor}",
            cuda=torch.version.cuda,
        )
    else:
        info.update(
            name=machine_info()["cpu"],
            threads=torch.get_num_threads(),
            memory_bytes=_meminfo("MemTotal"),
        )
    return info


def base_hardware_for(info: dict[str, Any]) -> str:
    """The built-in profile whose peak figures match the device (by its name)."""
    if info["device"] == "cpu":
        return "cpu"
    name = str(info.get("name", "")).upper()
    for key, profile in (
        ("H200", "h200"),
        ("H100", "h100"),
        ("A100", "a100"),
        ("6000", "rtx6000-ada"),
    ):
        if key in name:
            return profile
    return "h100"


# --------------------------------------------------------------------------- timing


def _time(fn: Callable[[], Any], device: str, warmup: int, reps: int, graph: bool):
    """(the times of `reps` runs in seconds, whether a CUDA graph was replayed, note)."""
    if device == "cpu":
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return times, False, ""
    import torch

    run, note, g = fn, "", None
    if graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run = g.replay
        except Exception as err:  # capture is an optimisation: fall back to eager launches
            g, note = None, f"cuda graph capture failed, eager: {type(err).__name__}: {err}"[:300]
            torch.cuda.synchronize()
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del g
    return times, run is not fn, note


def statistic(device: str) -> str:
    """How a composition's runs make its time: the median on a GPU (device time from CUDA
    events); the fastest run on a CPU, where other processes on a shared machine only ever
    add wall-clock time."""
    return "median" if device == "cuda" else "min"


def _stat(times: list[float], how: str) -> float:
    return min(times) if how == "min" else statistics.median(times)


# --------------------------------------------------------------------------- memory


def _kv_plan(spec: ProbeSpec, model: ModelProfile, elem: int, comps: list[Composition]):
    """(compositions that fit, skipped labels, blocks per pool, pools) within the memory
    budget left after the weights."""
    import torch

    if spec.device == "cuda":
        free, _total = torch.cuda.mem_get_info()
    else:
        free = _available_ram()
    weights = model.num_params * elem
    # Activations: logits [batch, vocab] and the attention splits, with room to spare.
    biggest = max(c.batch for c in comps)
    act = 4 * biggest * (model.vocab_size + 64 * model.q_dim) * 4 + (
        2 << 30 if spec.device == "cuda" else 0
    )
    budget = free * spec.memory_fraction - weights - act
    per_block = 2 * spec.block_size * model.kv_dim * elem  # K and V of one block, one pool
    fit = [c for c in comps if c.num_blocks(spec.block_size) * per_block <= budget]
    skipped = [c.label for c in comps if c not in fit]
    if not fit:
        raise RuntimeError(
            f"not enough memory: {free / 2**30:.1f} GiB free, weights {weights / 2**30:.1f} GiB"
        )
    blocks = max(c.num_blocks(spec.block_size) for c in fit)
    pools = int(max(1, min(model.num_layers, budget // (blocks * per_block))))
    return fit, skipped, blocks, pools


def _available_ram() -> int:
    return _meminfo("MemAvailable") or 4 << 30


def _meminfo(key: str) -> int:
    """A /proc/meminfo field in bytes (0 when unreadable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# --------------------------------------------------------------------------- the run


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
    fitted = _fit(spec, session.info, cost_model, session.rows, session.shapes, first)
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
    dtype = _torch_dtype(spec)
    elem = torch.empty((), dtype=dtype).element_size()
    model = load_model(spec.resolved_model())
    # The cost model prices bytes at the dtype actually run (float32 on a CPU).
    cost_model = model.replace(dtype_bytes=elem, kv_dtype_bytes=None)
    if spec.compositions is None and spec.grid_name() not in GRIDS:
        raise ValueError(f"unknown grid {spec.grid_name()!r}; grids: {', '.join(GRIDS)}")
    comps = spec.compositions or GRIDS[spec.grid_name()].compositions()
    comps, skipped, blocks, pools = _kv_plan(spec, cost_model, elem, comps)
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
        step_t, graphed, note = _time(lambda b=b: decoder.step(b, attn), *timing)
        attn_t, _, note2 = _time(lambda b=b, q=q: decoder.attention_only(b, attn, q), *timing)
    except RuntimeError as err:
        session.failed.append(f"{kname} {comp.label}: {type(err).__name__}: {err}"[:500])
        log(f"failed: {session.failed[-1]}")
        del b, q
        if spec.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        return
    session.notes.update(n for n in (note, note2) if n)
    step_s, attn_s = _stat(step_t, session.how), _stat(attn_t, session.how)
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
        write_json(json_out, report)
        Path(f"{json_out}.partial").unlink(missing_ok=True)
    if plot is not None:
        from feather_lab.probe.plot import plot_results

        report["plot"] = plot_results(report, plot)


def _fit(spec, info, model: ModelProfile, rows, shapes, kernel: str) -> dict[str, Any]:
    """Fit on the first kernel's rows; add predictions and the homogeneity summary."""
    fit_rows = [r for r in rows if r["kernel"] == kernel]
    labels = [r["composition"] for r in fit_rows]
    every = spec.holdout_every
    held = set(labels[every - 1 :: every]) if every > 1 else set()
    train = [r for r in fit_rows if r["composition"] not in held]
    test = [r for r in fit_rows if r["composition"] in held]
    base_name = spec.base_hardware or base_hardware_for(info)
    base = _device_figures(load_hardware(base_name), info)
    t_train = [r["decode_ms"] / 1e3 for r in train]
    fit = fit_profile(base, model, [shapes[r["composition"]] for r in train], t_train)
    pred_all = predict(fit.profile, model, [shapes[r["composition"]] for r in fit_rows])
    prior_all = predict(base, model, [shapes[r["composition"]] for r in fit_rows])
    for r, p, p0 in zip(fit_rows, pred_all, prior_all):
        r["heldout"] = r["composition"] in held
        r["predicted_ms"] = round(float(p) * 1e3, 4)
        r["prior_ms"] = round(float(p0) * 1e3, 4)
    held_pred = np.array([r["predicted_ms"] for r in test])
    held_true = np.array([r["decode_ms"] for r in test])
    held_mape = mape(held_pred, held_true) if test else float("nan")
    all_mape = mape(
        np.array([r["predicted_ms"] for r in fit_rows]),
        np.array([r["decode_ms"] for r in fit_rows]),
    )
    profile = _stamp(fit.profile, spec, info, model, fit.train_mape, len(train), held_mape)
    return {
        "profile": profile.to_dict(),
        "base_hardware": base_name,
        "train_mape": round(fit.train_mape, 4),
        "heldout_mape": round(held_mape, 4) if test else None,
        "all_mape": round(all_mape, 4),
        "samples": {"train": len(train), "heldout": len(test)},
        "rows": rows,
        "homogeneity": homogeneity(rows),
    }


def _device_figures(base: HardwareProfile, info: dict[str, Any]) -> HardwareProfile:
    """The base profile with the device's own L2 size and memory, where it reports them."""
    changes: dict[str, Any] = {}
    sources = dict(base.sources)
    if info.get("l2_cache_bytes"):
        changes["cache_bytes"] = float(info["l2_cache_bytes"])
        sources["cache_bytes"] = (
            f"torch.cuda.get_device_properties: L2_cache_size of {info['name']}"
        )
    if info.get("memory_bytes"):
        changes["memory_bytes"] = float(info["memory_bytes"])
        sources["memory_bytes"] = (
            f"torch.cuda.get_device_properties: total_memory of {info['name']}"
            if info["device"] == "cuda"
            else "MemTotal of this machine (/proc/meminfo): a CPU's KV cache lives in RAM"
        )
    return base.replace(**changes, sources=sources) if changes else base


def _stamp(profile, spec, info, model, train_mape, n, held_mape) -> HardwareProfile:
    m = machine_info()
    where = (
        f"{info.get('name')} (torch {info['torch']}, triton {info.get('triton')})"
        if spec.device == "cuda"
        else f"{m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB, torch {info['torch']})"
    )
    note = (
        f"Fitted by `feather probe --device {spec.device}` on {where}: random-weight "
        f"{model.name} decode steps ({model.dtype_bytes:g}-byte weights/KV), {n} compositions; "
        f"step-time MAPE train {train_mape:.1%}, held-out {held_mape:.1%}"
    )
    return stamp_fitted(profile, note, "probe-fitted")


def homogeneity(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kernel, batch and prefix length: step and attention time with one shared prefix vs
    all requests distinct (or the most prefixes measured): the homogeneity effect."""
    out = []
    keys = sorted({(r["kernel"], r["batch"], r["prefix_len"]) for r in rows})
    for kernel, batch, plen in keys:
        grp = sorted(
            (
                r
                for r in rows
                if (r["kernel"], r["batch"], r["prefix_len"]) == (kernel, batch, plen)
            ),
            key=lambda r: r["prefixes"],
        )
        if len(grp) < 2:
            continue
        one, many = grp[0], grp[-1]
        entry = {
            "kernel": kernel,
            "batch": batch,
            "prefix_len": plen,
            "prefixes": [one["prefixes"], many["prefixes"]],
            "decode_ms": [one["decode_ms"], many["decode_ms"]],
            "attn_ms": [one["attn_ms"], many["attn_ms"]],
            "decode_ratio": round(many["decode_ms"] / one["decode_ms"], 3),
            "attn_ratio": round(many["attn_ms"] / one["attn_ms"], 3),
        }
        if "predicted_ms" in one:
            entry["predicted_ratio"] = round(many["predicted_ms"] / one["predicted_ms"], 3)
            entry["prior_ratio"] = round(many["prior_ms"] / one["prior_ms"], 3)
        out.append(entry)
    return out


def summary_lines(report: dict[str, Any]) -> list[str]:
    """What the command prints: the fit's errors, the fitted parameters, the effect."""
    lines = [
        f"step-time MAPE: train {report['train_mape']:.1%} ({report['samples']['train']} "
        f"compositions), held-out "
        + (
            f"{report['heldout_mape']:.1%} ({report['samples']['heldout']} compositions)"
            if report["heldout_mape"] is not None
            else "n/a (no held-out compositions)"
        ),
        "fitted: "
        + ", ".join(f"{k}={report['profile'][k]:.4g}" for k in HardwareProfile.FIT_FIELDS),
    ]
    for h in report["homogeneity"]:
        if math.isfinite(h["decode_ratio"]):
            lines.append(
                f"{h['kernel']} batch {h['batch']}, prefix {h['prefix_len']}: "
                f"{h['prefixes'][1]} prefixes / 1 prefix: step x{h['decode_ratio']}, "
                f"attention x{h['attn_ratio']}"
                + (f" (fitted model x{h['predicted_ratio']})" if "predicted_ratio" in h else "")
            )
    return lines
