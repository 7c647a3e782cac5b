"""A profile's record format, shared by hardware and model profiles: field checks and JSON.

Profiles are frozen dataclasses validated on construction, so a bad value is reported with
the profile and field it came from, whether it was read from JSON or made with `replace`.
Each numeric field may name its source in a ``sources`` mapping.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar


class ProfileError(ValueError):
    """A profile is unknown, malformed, or has an out-of-range field."""


# --------------------------------------------------------------------------- checks
# Each check returns None when the value is fine, else a phrase for the error message.


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def positive(v: Any) -> str | None:
    return None if is_number(v) and v > 0 else "must be a finite number > 0"


def non_negative(v: Any) -> str | None:
    return None if is_number(v) and v >= 0 else "must be a finite number >= 0"


def fraction(v: Any) -> str | None:
    return None if is_number(v) and 0 < v <= 1 else "must be a number in (0, 1]"


def fraction0(v: Any) -> str | None:
    return None if is_number(v) and 0 <= v <= 1 else "must be a number in [0, 1]"


def positive_int(v: Any) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and v > 0
    return None if ok else "must be an integer > 0"


def non_negative_int(v: Any) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
    return None if ok else "must be an integer >= 0"


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def text(v: Any) -> str | None:
    return None if isinstance(v, str) else "must be a string"


PROVENANCES = ("measured", "derived", "estimate")
"""Where a hardware profile's constants come from: `measured` (fitted from a run on that
hardware), `derived` (a measured profile's kernel and cache constants carried to another
chip with its datasheet figures), `estimate` (assumptions, nothing measured)."""


def known_provenance(v: Any) -> str | None:
    return None if v in PROVENANCES else f"must be one of {', '.join(PROVENANCES)}"


Checks = Mapping[str, Callable[[Any], "str | None"]]


def validate_profile(obj: Any, kind: str, checks: Checks) -> None:
    name = obj.name
    if not isinstance(name, str) or not name:
        raise ProfileError(f"{kind} profile: field 'name' must be a non-empty string, got {name!r}")
    for fname, check in checks.items():
        value = getattr(obj, fname)
        problem = check(value)
        if problem is not None:
            raise ProfileError(
                f"{kind} profile {name!r}: field {fname!r} {problem} (got {value!r})"
            )
    sources = obj.sources
    if not isinstance(sources, Mapping):
        raise ProfileError(f"{kind} profile {name!r}: field 'sources' must be a mapping")
    known = {f.name for f in dataclasses.fields(obj)}
    for key, source in sources.items():
        if key not in known:
            raise ProfileError(
                f"{kind} profile {name!r}: 'sources' names unknown field {key!r}; "
                f"fields are {', '.join(sorted(known))}"
            )
        if not isinstance(source, str) or not source:
            raise ProfileError(
                f"{kind} profile {name!r}: source for field {key!r} must be a non-empty string"
            )
    # Read-only view so a frozen profile stays frozen (sources is excluded from eq/hash).
    object.__setattr__(obj, "sources", MappingProxyType(dict(sources)))


_P = TypeVar("_P", bound="ProfileIO")


class ProfileIO:
    """Shared validation, copying and dict/JSON conversion; subclasses set _KIND and _CHECKS."""

    _KIND: ClassVar[str]
    _CHECKS: ClassVar[Checks]

    def __post_init__(self) -> None:
        validate_profile(self, self._KIND, self._CHECKS)

    def replace(self: _P, **changes: Any) -> _P:
        """A validated copy with some fields changed (fitted efficiencies, an fp8 KV cache)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], name: str | None = None, origin: str = ""):
        """Build a profile from a JSON-like mapping; ``name`` overrides ``data["name"]``."""
        where = f"{origin}: " if origin else ""
        if not isinstance(data, Mapping):
            raise ProfileError(f"{where}{cls._KIND} profile must be a JSON object")
        d = {k: v for k, v in data.items() if not k.startswith("_")}
        if name is not None:
            d["name"] = name
        label = d.get("name", "?")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise ProfileError(
                f"{where}{cls._KIND} profile {label!r}: unknown field(s) {', '.join(unknown)}; "
                f"valid fields are {', '.join(fields)}"
            )
        missing = [
            f.name
            for f in fields.values()
            if f.name not in d
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ProfileError(
                f"{where}{cls._KIND} profile {label!r}: missing field(s) {', '.join(missing)}"
            )
        try:
            return cls(**d)
        except ProfileError as e:
            raise ProfileError(f"{where}{e}") from None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``sources`` as a dict), the format ``from_dict`` reads."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        out["sources"] = dict(out["sources"])
        return out

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent) + "\n"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write this profile as a one-profile JSON file that ``load_*(path)`` reads back."""
        p = Path(path)
        p.write_text(self.to_json(), encoding="utf-8")
        return p
