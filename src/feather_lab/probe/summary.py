"""The probe's homogeneity effect (one shared prefix vs many) and the lines it prints."""

from __future__ import annotations

import math
from typing import Any

from feather_sched.cost import HardwareProfile


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
