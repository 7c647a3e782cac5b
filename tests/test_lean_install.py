"""The scheduler stands alone: what an engine loads imports no lab module and none of the
lab's libraries, and the package's own dependencies are numpy, xxhash and packaging."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
LAB = ("feather_lab", "typer", "rich", "matplotlib", "httpx")

_BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"the scheduler imported {{name}}")
sys.meta_path.insert(0, Block())
"""


def _import_blocked(code: str, blocked: tuple[str, ...]) -> subprocess.CompletedProcess:
    script = _BLOCKER.format(blocked=set(blocked)) + code
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_dependencies_are_the_schedulers_own() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]}
    assert names == {"numpy", "xxhash", "packaging"}


def test_scheduler_core_imports_no_lab() -> None:
    proc = _import_blocked(
        "import feather_sched\n"
        "from feather_sched.policies.registry import make_policy, policy_names\n"
        "for name in policy_names():\n"
        "    if name != 'feather-ppo':\n"  # its weights load with numpy only, on first use
        "        make_policy(name)\n"
        "import feather_sched.sglang.plugin, feather_sched.sglang.queue\n"
        "import feather_sched.host.versions, feather_sched.routing.feather_rule\n"
        "import feather_sched.vllm, feather_sched.ray, feather_sched.vllm.local\n",
        (*LAB, "torch", "vllm", "sglang", "ray"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


_BESIDE_ENGINE = """
import sys
import {engine}
before = set(sys.modules)
{feather}
added = {{m.split(".")[0] for m in set(sys.modules) - before}}
assert not added & {lab!r}, sorted(added & {lab!r})
"""


def _beside_engine(engine: str, feather: str) -> subprocess.CompletedProcess:
    """Import `engine` (what it loads itself is its own), then Feather's class: the modules the
    second import adds hold nothing of the lab."""
    script = _BESIDE_ENGINE.format(engine=engine, feather=feather, lab=set(LAB))
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


@pytest.mark.parametrize(
    ("engine", "module", "feather"),
    [
        pytest.param(
            "vllm",
            "vllm.v1.core.sched.async_scheduler",
            "from feather_sched.vllm import FeatherScheduler",
            marks=pytest.mark.vllm,
            id="vllm",
        ),
        pytest.param(
            "ray",
            "ray.serve.request_router",
            "from feather_sched.ray import FeatherRequestRouter",
            marks=pytest.mark.ray,
            id="ray",
        ),
    ],
)
def test_engine_class_imports_no_lab(engine: str, module: str, feather: str) -> None:
    pytest.importorskip(engine, reason=f"needs {engine}: the '{engine}' extra")
    proc = _beside_engine(module, feather)
    assert proc.returncode == 0, proc.stderr[-3000:]
