"""The README's CPU quickstart for vLLM, run as written: a real `vllm-cpu` server with Feather's
scheduler, one request, Feather named in the engine's log. Installs are .ci/run's job."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from requires import require
from test_readme import ROOT, bash_commands, readme_blocks

pytestmark = pytest.mark.vllm
require("vllm", "vllm", "needs the real vLLM engine: pip install -e '.[vllm]' (see pyproject)")


def quickstart_script(engine: str) -> str:
    """The README's block for `engine`, its install lines left out, as one bash script."""
    (block,) = [body for lang, body in readme_blocks((ROOT / "README.md").read_text(), engine)]
    lines = [c for c in bash_commands(block) if not re.match(r"pip (install|uninstall)\b", c)]
    assert len(lines) >= 5, lines
    return "set -e\n" + "\n".join(lines) + "\n"


def test_vllm_cpu_quickstart_runs_as_written(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEATHER_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    proc = subprocess.Popen(
        ["bash", "-c", quickstart_script("vllm-cpu")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=600)
    finally:  # the server too, wherever the script stopped
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "server.log").read_text() if (tmp_path / "server.log").exists() else ""
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{out[-2000:]}\n{err[-2000:]}\n{log[-3000:]}"
    )
    completion, _ = json.JSONDecoder().raw_decode(out[out.index("{") :])  # the curl's answer
    assert completion["usage"]["completion_tokens"] == 8
    assert "feather scheduler: policy 'feather'" in out and "FeatherScheduler" in out
    assert 'feather_info{policy="feather"}' in out  # Feather's series on vLLM's /metrics
