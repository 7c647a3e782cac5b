"""The fit of a hardware profile to measured step samples, and its errors.

`HardwareProfile.FIT_FIELDS` are fitted on the training compositions (`cost.fit`), starting
from a base profile's peak figures; every `holdout_every`-th composition is held out and
priced by the fitted model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from feather_lab.harness.vllm_calibrate_samples import Sample, split
from feather_lab.harness.vllm_calibrate_spec import CalibrateSpec
from feather_sched.cost import HardwareProfile, ModelProfile, load_hardware
from feather_sched.cost.fit import fit_profile, mape, predict, stamp_fitted


@dataclass(frozen=True)
class CalibrationFit:
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


def fit_samples(
    spec: CalibrateSpec, model: ModelProfile, samples: list[Sample], tick: Callable[[str], None]
) -> CalibrationFit:
    """Fit the base profile to the training compositions; price the held-out ones with it."""
    train, held = split(samples, spec.holdout_every)
    tick(f"fitting {len(train)} samples")
    base = load_hardware(spec.base_hardware)
    fit = fit_profile(base, model, [s.shape for s in train], [s.seconds for s in train])
    held_pred = predict(fit.profile, model, [s.shape for s in held])
    held_mape = mape(held_pred, np.array([s.seconds for s in held])) if held else float("nan")
    profile = _stamp(fit.profile, spec, fit.train_mape, len(train), held_mape)
    return CalibrationFit(profile, fit.train_mape, train, held, held_pred, held_mape)


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
