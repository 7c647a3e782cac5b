"""cost: hardware and model profiles (data) and the step-time model."""

from feather_sched.cost.profiles import (
    HardwareProfile,
    ModelProfile,
    ProfileError,
    list_hardware,
    list_models,
    load_hardware,
    load_model,
)
from feather_sched.cost.step_model import BatchShape, KernelMode, StepCost, StepCostModel

__all__ = [
    "BatchShape",
    "HardwareProfile",
    "KernelMode",
    "ModelProfile",
    "ProfileError",
    "StepCost",
    "StepCostModel",
    "list_hardware",
    "list_models",
    "load_hardware",
    "load_model",
]
