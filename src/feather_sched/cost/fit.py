"""Fit a HardwareProfile's free parameters to measured step times (any engine).

Input: samples of (BatchShape, measured seconds). Output: the profile with
`HardwareProfile.FIT_FIELDS` fitted, chosen to minimise the mean absolute percentage error
(MAPE) of `StepCostModel.step_time`, which is the error `feather calibrate` reports.

Method (numpy only): the step model is `max(compute, memory) + overhead + per_seq * seqs`.
For fixed efficiencies and cache parameters the max() term is a known per-sample value, and
the two overheads enter linearly, so they come from a weighted least-squares solve (weights
1/t, i.e. relative error; clipped at 0). The five non-linear parameters are searched on a log
grid, then refined by a finer grid around the best point. Cheap: a few thousand candidate
profiles times the samples.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

import numpy as np

from feather_sched.cost import BatchShape, HardwareProfile, ModelProfile, StepCostModel


@dataclass(frozen=True)
class FitResult:
    profile: HardwareProfile
    train_mape: float
    """Mean absolute percentage error on the samples it was fitted to (fraction)."""


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured))


def predict(profile: HardwareProfile, model: ModelProfile, shapes: Sequence[BatchShape]):
    cost = StepCostModel(profile, model)
    return np.array([cost.step_time(s) for s in shapes])


def _roofline(profile: HardwareProfile, model: ModelProfile, shapes, seqs: np.ndarray):
    """max(compute, memory) per sample: step_time without its two overhead terms."""
    zero = profile.replace(step_overhead_s=0.0, per_seq_overhead_s=0.0)
    return predict(zero, model, shapes)


def _overheads(base: np.ndarray, seqs: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Least squares of (t - base) / t on (1, seqs) / t, both coefficients >= 0."""
    w = 1.0 / t
    y = (t - base) * w
    a = np.stack([w, seqs * w], axis=1)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    c, d = float(coef[0]), float(coef[1])
    if c < 0 or d < 0:  # clip one at 0 and refit the other alone
        options = []
        for col in (0, 1):
            x = a[:, col]
            k = max(0.0, float(x @ y / (x @ x)))
            pair = (k, 0.0) if col == 0 else (0.0, k)
            options.append((float(np.sum((y - x * k) ** 2)), pair))
        c, d = min(options)[1]
    return c, d


def _evaluate(profile, model, shapes, seqs, t) -> tuple[float, HardwareProfile]:
    base = _roofline(profile, model, shapes, seqs)
    c, d = _overheads(base, seqs, t)
    fitted = profile.replace(step_overhead_s=c, per_seq_overhead_s=d)
    return mape(base + c + d * seqs, t), fitted


def fit_profile(
    base: HardwareProfile,
    model: ModelProfile,
    shapes: Sequence[BatchShape],
    seconds: Sequence[float],
    grid: int = 7,
) -> FitResult:
    """Fit FIT_FIELDS of `base` to the samples; other fields (peaks, cache size) are kept."""
    t = np.asarray(seconds, dtype=float)
    if len(shapes) != t.size or t.size < 3 or np.any(t <= 0):
        raise ValueError("need >= 3 samples with positive times, one per shape")
    seqs = np.array([s.num_decode + s.num_prefill_seqs for s in shapes], dtype=float)
    bw = np.geomspace(0.005, 1.0, grid)
    fl = np.geomspace(0.002, 1.0, grid)
    ce = np.array([0.0, 0.05, 0.2, 0.5, 1.0])
    rx = np.array([0.5, 1.0, 2.0, 4.0])
    hit = np.array([0.0, 0.1, 0.2, 0.35, 0.5, 1.0])
    best: tuple[float, HardwareProfile] | None = None
    for b, f, c, r, h in itertools.product(bw, fl, ce, rx, hit):
        cand = base.replace(
            bandwidth_efficiency=float(b),
            compute_efficiency=float(f),
            cache_efficiency=float(c),
            reuse_exponent=float(r),
            cache_read_cost=float(h),
        )
        score = _evaluate(cand, model, shapes, seqs, t)
        if best is None or score[0] < best[0]:
            best = score
    assert best is not None
    # Refine: a finer grid around the best efficiencies (cache parameters kept).
    p = best[1]
    for _ in range(2):
        for b, f in itertools.product(
            np.clip(p.bandwidth_efficiency * np.geomspace(0.6, 1.6, 9), 1e-4, 1.0),
            np.clip(p.compute_efficiency * np.geomspace(0.6, 1.6, 9), 1e-4, 1.0),
        ):
            score = _evaluate(
                p.replace(bandwidth_efficiency=float(b), compute_efficiency=float(f)),
                model,
                shapes,
                seqs,
                t,
            )
            if score[0] < best[0]:
                best = score
        p = best[1]
    return FitResult(best[1], best[0])


def stamp_fitted(profile: HardwareProfile, note: str, suffix: str) -> HardwareProfile:
    """The fitted profile, saying where its numbers came from: `note` (how it was measured,
    and its error) becomes the source of every fitted field and leads the description."""
    sources = dict(profile.sources)
    for name in HardwareProfile.FIT_FIELDS:
        sources[name] = note
    return profile.replace(
        name=f"{profile.name}-{suffix}",
        description=f"{note}. Peak figures from the {profile.name!r} profile.",
        provenance="measured",
        provenance_note=f"{note} (fitted on {date.today().isoformat()}).",
        sources=sources,
    )
