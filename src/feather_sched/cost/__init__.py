"""cost: hardware and model profiles (data), the step-time model, and names to a model
(`resolve`)."""

from feather_sched.cost.profiles import (
    HardwareProfile,
    ModelProfile,
    ProfileError,
    list_hardware,
    list_models,
    load_hardware,
    load_model,
)
from feather_sched.cost.resolve import cost_options, prior_cost, resolve_cost
from feather_sched.cost.step_model import BatchShape, KernelMode, StepCost, StepCostModel

__all__ = [
    "BatchShape",
    "HardwareProfile",
    "KernelMode",
    "ModelProfile",
    "ProfileError",
    "StepCost",
    "StepCostModel",
    "cost_options",
    "list_hardware",
    "list_models",
    "load_hardware",
    "load_model",
    "prior_cost",
    "resolve_cost",
]
