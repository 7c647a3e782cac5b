"""The hardware profile fitted to the probe's decode steps (`cost.fit`, as `feather calibrate`
does), on the first kernel's rows; every `holdout_every`-th composition is held out and priced
by the fitted model."""

from __future__ import annotations

from typing import Any

import numpy as np

from feather_lab.bench.machine import machine_info
from feather_lab.probe.device import base_hardware_for
from feather_lab.probe.summary import homogeneity
from feather_sched.cost import HardwareProfile, ModelProfile, load_hardware
from feather_sched.cost.fit import fit_profile, mape, predict, stamp_fitted


def fit_rows(spec, info, model: ModelProfile, rows, shapes, kernel: str) -> dict[str, Any]:
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
