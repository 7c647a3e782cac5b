"""Hardware and model profiles for the step-time cost model: the built-in ones and loading.

Profiles are data: the built-in ones live in ``profiles/hardware.json`` and
``profiles/models.json`` next to this module. A profile can also be loaded from a JSON file
holding one profile (that is how ``feather calibrate`` hands back a fitted hardware profile):

    {"name": "h100-fitted", "mem_bandwidth_Bps": 3.35e12, ..., "sources": {...}}
"""

from __future__ import annotations

import json
import os
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from feather_sched.cost.hardware_profile import HardwareProfile
from feather_sched.cost.model_profile import ModelProfile
from feather_sched.cost.profile_schema import PROVENANCES, ProfileError

__all__ = [
    "PROVENANCES",
    "HardwareProfile",
    "ModelProfile",
    "ProfileError",
    "list_hardware",
    "list_models",
    "load_hardware",
    "load_model",
]

_PROFILE_DIR = "profiles"


def _read_builtin(filename: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(_PROFILE_DIR).joinpath(filename).read_text("utf-8")
    data = json.loads(text)
    return data["profiles"]


@cache
def _builtin_hardware() -> dict[str, HardwareProfile]:
    raw = _read_builtin("hardware.json")
    return {
        k: HardwareProfile.from_dict(v, name=k, origin="built-in hardware.json")
        for k, v in raw.items()
    }


@cache
def _builtin_models() -> dict[str, ModelProfile]:
    raw = _read_builtin("models.json")
    return {
        k: ModelProfile.from_dict(v, name=k, origin="built-in models.json") for k, v in raw.items()
    }


def list_hardware() -> list[str]:
    """Names of the built-in hardware profiles."""
    return sorted(_builtin_hardware())


def list_models() -> list[str]:
    """Names of the built-in model profiles."""
    return sorted(_builtin_models())


def _looks_like_path(s: str) -> bool:
    return s.endswith(".json") or "/" in s or os.sep in s or Path(s).is_file()


def _load_file(cls: type, path: Path) -> Any:
    kind = cls._KIND
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"{kind} profile file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not valid JSON ({e})") from None
    if isinstance(data, dict) and "profiles" in data:
        profiles = data["profiles"]
        if not isinstance(profiles, dict) or len(profiles) != 1:
            raise ProfileError(
                f"{path}: a profile file must hold exactly one {kind} profile "
                f"(found {len(profiles) if isinstance(profiles, dict) else 'no'} under 'profiles')"
            )
        ((pname, pdata),) = profiles.items()
        return cls.from_dict(pdata, name=pname, origin=str(path))
    name = data.get("name") if isinstance(data, dict) else None
    return cls.from_dict(data, name=name or path.stem, origin=str(path))


def _load(name_or_path: str | os.PathLike[str], builtins: dict[str, Any], cls: type) -> Any:
    if isinstance(name_or_path, os.PathLike):
        return _load_file(cls, Path(name_or_path))
    if not isinstance(name_or_path, str):
        raise ProfileError(f"expected a {cls._KIND} profile name or path, got {name_or_path!r}")
    key = name_or_path.strip().lower()
    if key in builtins:
        return builtins[key]
    if _looks_like_path(name_or_path):
        return _load_file(cls, Path(name_or_path))
    raise ProfileError(
        f"unknown {cls._KIND} profile {name_or_path!r}; valid names: {', '.join(sorted(builtins))} "
        "(or pass a path to a JSON profile file)"
    )


def load_hardware(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """A built-in hardware profile by name (case-insensitive) or one read from a JSON file."""
    return _load(name_or_path, _builtin_hardware(), HardwareProfile)


def load_model(name_or_path: str | os.PathLike[str]) -> ModelProfile:
    """A built-in model profile by name (case-insensitive) or one read from a JSON file."""
    return _load(name_or_path, _builtin_models(), ModelProfile)
