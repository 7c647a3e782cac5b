"""Optional engines for the test suite, and the CI variables that make them required.

Each engine's tests carry its marker and skip, with a reason, where the engine is missing, so
the core suite runs anywhere. CI installs each engine in its own environment and sets that
engine's variable there (`.ci/run`); with it set to 1 the engine's tests cannot pass by
skipping (see conftest.py): a missing or broken import is an error, not a skip.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRE_VARS = {
    "vllm": "FEATHER_REQUIRE_VLLM",
    "sglang": "FEATHER_REQUIRE_SGLANG",
    "ray": "FEATHER_REQUIRE_RAY",
    "triton": "FEATHER_REQUIRE_TRITON",
    "rl": "FEATHER_REQUIRE_RL",
}
"""Marker -> the variable that says its engine is installed here and must run."""

ENGINE_MODULES = {
    "vllm": ("vllm",),
    "sglang": ("sglang",),
    "ray": ("ray",),
    "triton": ("torch", "triton"),
    "rl": ("torch", "stable_baselines3"),
}
"""Marker -> the top-level modules its tests need (checked installed at session start)."""


def required(marker: str) -> bool:
    """Is this marker's engine required here (its variable set to 1)?"""
    return os.environ.get(REQUIRE_VARS[marker]) == "1"


def require(module: str, marker: str, reason: str) -> ModuleType:
    """`module` imported; where `marker`'s engine is not required, a missing one skips the
    caller with `reason` (pytest.importorskip), else its ImportError fails the run."""
    if required(marker):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=reason)
