"""The README's commands, run as written (`pytest -m slow`; CI runs it).

Every ```bash and ```python block of README.md, in order, in one scratch folder, so a later
command finds what an earlier one wrote (T.jsonl) as a reader following the README would. A
block under `<!-- run: ENGINE -->` needs that engine: its own test runs it
(tests/test_quickstart.py). `feather` is this checkout's CLI (`python -m feather_lab.cli`
with `src` on the path), so it also runs uninstalled. A bash block runs command by command (a
line with its `\\` continuations); each must exit 0. The first, `pip install -e ".[bench]" &&
feather bench`, runs its main job: the whole default suite. What cannot run
here is skipped by the rules below, each with its reason; a rule that matches nothing fails
the test, so the list stays the README's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600

SKIP_BASH: tuple[tuple[str, str], ...] = (
    (r"\bruff check\b.*\bpytest\b", "the test suite itself (.ci/run's first step)"),
    (r"\bpip install\b", "installs packages: .ci/run does, in fresh environments"),
    (r"\bvllm serve\b", "needs vLLM on a GPU: the `vllm` tests run the engine on CPU"),
    (r"sglang\.launch_server", "needs an SGLang server: the `sglang` tests run its scheduler"),
    (r"^feather replay\b", "needs live servers: tests/test_replay_vllm.py starts real ones"),
)
"""(pattern of a bash command, why it is skipped)."""

INSTALLED = re.compile(r"^pip install -e \"\.\[(?:bench|dev)\]\" && (.+)$")
"""`pip install -e ".[bench]" && REST`: the checkout is what runs here (installed in CI, `src`
on the path otherwise), so REST runs: the README's first command is its main job."""

SKIP_PYTHON: tuple[tuple[str, str], ...] = (
    (r"^from ray\b", "needs Ray Serve: the `ray` tests run a local Serve app"),
)
"""(pattern of a python block, why it is skipped)."""


BLOCK = re.compile(r"^(?:<!-- run: ([\w-]+) -->\n)?```(bash|python)\n(.*?)^```", re.M | re.S)
"""A fenced bash or python block, with the engine its `<!-- run: ENGINE -->` line names."""


def readme_blocks(text: str, engine: str | None = None) -> list[tuple[str, str]]:
    """The fenced bash and python blocks that need `engine` (None: no engine): (language, body)."""
    return [(m.group(2), m.group(3)) for m in BLOCK.finditer(text) if m.group(1) == engine]


def bash_commands(body: str) -> list[str]:
    """A block's commands: each line joined with its `\\` continuations."""
    commands, current = [], ""
    for line in body.splitlines():
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if current.strip():
                commands.append(current.strip())
            current = ""
    return commands


def _skip_reason(text: str, rules, used: set[str]) -> str | None:
    for pattern, reason in rules:
        if re.search(pattern, text, re.M):
            used.add(pattern)
            return reason
    return None


def _environment(scratch: Path) -> dict[str, str]:
    """PATH with a `feather` that is this checkout's CLI; `src` on PYTHONPATH."""
    bin_dir = scratch / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "feather"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m feather_lab.cli "$@"\n')
    shim.chmod(0o755)
    python = bin_dir / "python"
    python.symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEATHER_")}
    paths = [str(ROOT / "src"), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env["MPLBACKEND"] = "Agg"
    return env


def _runner(scratch: Path, env: dict[str, str]) -> Callable[[list[str], str], None]:
    def run(argv: list[str], shown: str) -> None:
        proc = subprocess.run(
            argv, cwd=scratch, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
        assert proc.returncode == 0, (
            f"README command failed (exit {proc.returncode}): {shown}\n"
            f"stdout: ...{proc.stdout[-2000:]}\nstderr: ...{proc.stderr[-3000:]}"
        )

    return run


@pytest.mark.slow
def test_readme_commands_run_as_written(tmp_path: Path) -> None:
    run = _runner(tmp_path, _environment(tmp_path))
    used: set[str] = set()
    ran, skipped = [], []
    for language, body in readme_blocks((ROOT / "README.md").read_text()):
        if language == "python":
            reason = _skip_reason(body, SKIP_PYTHON, used)
            if reason is None:
                run([sys.executable, "-c", body], body.strip().splitlines()[0])
            (ran if reason is None else skipped).append((body.splitlines()[0], reason))
            continue
        for written in bash_commands(body):
            reason = _skip_reason(written, SKIP_BASH[:1], used)  # the test suite, whole
            installed = INSTALLED.match(written)
            command = installed.group(1) if installed else written
            reason = reason or _skip_reason(command, SKIP_BASH, used)
            if reason is None and command.startswith("jq ") and shutil.which("jq") is None:
                reason = "needs jq, not installed here"
            if reason is None:
                run(["bash", "-c", command], written)
            (ran if reason is None else skipped).append((written, reason))
    unused = [p for p, _ in (*SKIP_BASH, *SKIP_PYTHON) if p not in used]
    assert not unused, f"skip rules that match no README command any more: {unused}"
    assert len(ran) >= 4, (ran, skipped)
    print("\n".join(f"skipped: {c}\n  ({r})" for c, r in skipped))
