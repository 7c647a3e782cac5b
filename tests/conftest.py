"""CI that cannot skip what it claims to test.

Tests that need an optional engine carry its marker (`vllm`, `sglang`, `ray`, `triton`, `rl`)
and skip where it is missing. Where CI installs an engine it sets the engine's variable
(tests/requires.py: FEATHER_REQUIRE_VLLM, FEATHER_REQUIRE_SGLANG, FEATHER_REQUIRE_RAY,
FEATHER_REQUIRE_TRITON, FEATHER_REQUIRE_RL) to 1, and then:

- the run stops before collecting anything if the engine is not installed at all;
- a test module's engine import is a real import (`requires.require`): a broken one is an
  error, not a skipped module;
- a test carrying the marker that skips anyway is reported as a failure, with its skip
  reason. Unless it also carries the marker of an engine not required in this run: the
  `ray and vllm` test is not a vLLM-env failure before ray is installed.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from requires import ENGINE_MODULES, REQUIRE_VARS, required

# Tests write records into scratch folders from whatever tree they run in: a developer's
# uncommitted changes must not fail them (bench.record refuses a dirty tree otherwise;
# tests/test_record.py checks that refusal with this unset).
os.environ.setdefault("FEATHER_ALLOW_DIRTY", "1")


def pytest_configure(config: pytest.Config) -> None:
    for marker, var in REQUIRE_VARS.items():
        if not required(marker):
            continue
        missing = [m for m in ENGINE_MODULES[marker] if importlib.util.find_spec(m) is None]
        if missing:
            raise pytest.UsageError(
                f"{var}=1, but {', '.join(missing)} is not installed in this environment "
                f"(the {marker!r} tests must run here; see pyproject.toml's extras)"
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    markers = [m for m in REQUIRE_VARS if item.get_closest_marker(m) is not None]
    if not markers or not all(required(m) for m in markers):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    reason = str(reason).removeprefix("Skipped: ")
    variables = ", ".join(f"{REQUIRE_VARS[m]}=1" for m in markers)
    report.outcome = "failed"
    report.longrepr = f"skipped where {variables} requires it to run: {reason}"


def _installed(marker: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ENGINE_MODULES[marker])


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A module skipped whole at import (a module-level `importorskip`) never reaches the
    per-test hook above; when the module carries a required marker, its skip fails too."""
    outcome = yield
    report = outcome.get_result()
    path = getattr(collector, "path", None)
    if not report.skipped or path is None or path.suffix != ".py":
        return
    text = path.read_text(encoding="utf-8")
    carried = [m for m in REQUIRE_VARS if f"pytest.mark.{m}" in text]
    markers = [m for m in carried if required(m)]
    # a module that also needs an engine this environment does not install may skip
    absent = [m for m in carried if not required(m) and not _installed(m)]
    if markers and not absent:
        variables = ", ".join(f"{REQUIRE_VARS[m]}=1" for m in markers)
        report.outcome = "failed"
        report.longrepr = (
            f"{path.name} skipped whole where {variables} requires it: {report.longrepr}"
        )
