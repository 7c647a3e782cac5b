"""Profile names to a cost model: the one place text becomes a `StepCostModel`.

Policies and routing rules take a cost model object (or None: no cost model); names of
profiles (built-in names or JSON paths, from the command line, a JSON environment variable,
a record, Ray Serve's keyword options) are turned into one here, so every entry point
checks them alike and says the same thing about a bad one (the value, and the valid ones):

- `resolve_cost`: (hardware, model, kernel) names -> the cost model.
- `prior_cost`: `--feather-hardware`'s one rule (unset: the run's own hardware; `none`: no
  prior) -> Feather's step-cost prior, or None.
- `cost_options`: keyword options as text (`hardware`, `model`, `kernel`) -> the same
  options with the cost model they name (`cost`), for a constructor that takes objects.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from feather_sched.cost.step_model import KernelMode, StepCostModel

__all__ = ["COST_NAMES", "NO_PRIOR", "cost_options", "prior_cost", "prior_hardware", "resolve_cost"]

ProfileName = str | os.PathLike[str]
"""A built-in profile's name or a JSON profile file's path."""

COST_NAMES = ("hardware", "model", "kernel")
"""The keyword options that name a cost model's parts."""

NO_PRIOR = "none"
"""`--feather-hardware none`: Feather runs without a step-cost prior."""


def resolve_cost(
    hardware: ProfileName, model: ProfileName, kernel: KernelMode | str = KernelMode.PAGED
) -> StepCostModel:
    """The cost model the names give. A bad one raises ValueError (`ProfileError`) naming
    it and the valid names, before anything is built on it."""
    return StepCostModel(hardware, model, kernel)


def prior_hardware(feather_hardware: str | None, run_hardware: str | None) -> str | None:
    """The hardware profile Feather's prior uses, by the one rule of `--feather-hardware`:
    unset, the run's own hardware (a real engine's run has no profile of its own, so it
    gets a prior only when one is named: the profile `feather calibrate` fitted); `none`,
    no prior (None)."""
    hardware = feather_hardware or run_hardware
    return None if hardware is None or hardware == NO_PRIOR else hardware


def prior_cost(
    feather_hardware: str | None,
    run_hardware: str | None,
    model: ProfileName,
    kernel: KernelMode | str = KernelMode.PAGED,
) -> StepCostModel | None:
    """Feather's step-cost prior (`prior_hardware`'s profile with the run's model and
    kernel), or None for no prior. A bad named profile is an error naming the option."""
    hardware = prior_hardware(feather_hardware, run_hardware)
    if hardware is None:
        return None
    try:
        return resolve_cost(hardware, model, kernel)
    except (ValueError, OSError) as err:
        if feather_hardware is None:
            raise  # the run's own profiles: their own message
        raise ValueError(f"--feather-hardware {feather_hardware}: {err}") from None


def cost_options(
    options: Mapping[str, Any],
    hardware: ProfileName | None = None,
    model: ProfileName | None = None,
) -> dict[str, Any]:
    """`options` with the profile names in it (`COST_NAMES`) replaced by the cost model
    they name, as `cost`; `hardware`/`model` are the receiver's defaults for a name left
    out. Neither profile named (nor defaulted): `cost` None, no cost model. A cost model
    given as `cost` passes as it is; with names beside it, which one counts would be a
    guess, so that is an error."""
    named = [k for k in COST_NAMES if k in options]
    if "cost" in options:
        if named:
            raise ValueError(f"give either cost or {'/'.join(named)}, not both")
        return dict(options)
    out = {k: v for k, v in options.items() if k not in COST_NAMES}
    hw = options.get("hardware", hardware)
    m = options.get("model", model)
    if (hw is None) != (m is None):
        raise ValueError("hardware and model profiles go together (both or neither)")
    out["cost"] = None if hw is None else resolve_cost(hw, m, options.get("kernel", "paged"))
    return out
