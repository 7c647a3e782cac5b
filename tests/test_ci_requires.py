"""The CI rule of tests/conftest.py, run on a throwaway suite: where an engine's require
variable is set, a test carrying its marker that skips fails, and a missing engine stops the
run before collection; without the variable both are plain skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SUITE = """
import pytest

@pytest.mark.rl
def test_rl_skips():
    pytest.skip("engine absent")

@pytest.mark.rl
@pytest.mark.ray
def test_rl_and_ray_skips():
    pytest.skip("ray absent")

def test_core_skips():
    pytest.skip("not an engine test")
"""


def _suite(tmp_path: Path, rl_modules: tuple[str, ...]) -> Path:
    for name in ("conftest.py", "requires.py"):
        shutil.copy(HERE / name, tmp_path / name)
    requires = tmp_path / "requires.py"
    text = requires.read_text()
    old = '"rl": ("torch", "stable_baselines3"),'
    assert old in text
    requires.write_text(text.replace(old, f'"rl": {rl_modules!r},'))
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    rl: x\n    ray: y\n")
    return tmp_path


def _run(root: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FEATHER_REQUIRE_")}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", str(root)]
    return subprocess.run(
        cmd, cwd=root, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("required", [False, True])
def test_a_required_engine_test_cannot_pass_by_skipping(tmp_path: Path, required: bool) -> None:
    root = _suite(tmp_path, ("json",))  # an "engine" that is installed
    proc = _run(root, **({"FEATHER_REQUIRE_RL": "1"} if required else {}))
    out = proc.stdout
    if not required:
        assert proc.returncode == 0 and "3 skipped" in out, out
        return
    assert proc.returncode == 1, out
    assert "1 failed, 2 skipped" in out, out
    assert "FAILED" in out and "test_rl_skips" in out
    assert "FEATHER_REQUIRE_RL=1 requires it to run: engine absent" in out


def test_a_required_engine_that_is_not_installed_stops_the_run(tmp_path: Path) -> None:
    root = _suite(tmp_path, ("feather_no_such_engine",))
    proc = _run(root, FEATHER_REQUIRE_RL="1")
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "FEATHER_REQUIRE_RL=1, but feather_no_such_engine is not installed" in proc.stderr
