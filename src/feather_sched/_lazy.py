"""Names a package exports, imported on first use: an engine package must not import its
engine (or a sibling's) before the engine asks for the class."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` that resolves each name from its module on first access."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
