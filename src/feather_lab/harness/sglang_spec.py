"""What the SGLang loop harness serves, shared by its two sides: the requests and the spec
(`sglang_engine` runs the scheduler process, `sglang_client` plays the tokenizer). Its own
module so that neither side imports the other for its types: the engine imports the client,
never the reverse."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from feather_lab.harness.tiny_llama import TINY_LLAMA, TinyLlamaSpec


@dataclass(frozen=True)
class ServeRequest:
    rid: str
    """Unique, and no rid a prefix of another: SGLang's `abort_request` matches by prefix
    (`req.rid.startswith(abort.rid)`)."""
    prompt: Sequence[int]
    output_len: int
    arrival_s: float = 0.0
    group: str | None = None
    abort_after_tokens: int | None = None
    """Send an `AbortReq` once this many output tokens were seen (0: right after sending)."""


SERVER_ARGS = (
    "schedule_policy",
    "max_total_tokens",
    "max_running_requests",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "page_size",
    "enable_metrics",
)
"""ServeSpec fields passed to SGLang's `ServerArgs` under the same name."""


@dataclass
class ServeSpec:
    """One scheduler process: its SGLang settings, Feather's, and the runs it serves."""

    runs: list[list[ServeRequest]]
    """Served one after the other on the same scheduler; the radix cache is flushed
    (`FlushCacheReqInput`) between runs."""
    feather_policy: str | None = None
    """FEATHER_POLICY with SGLANG_PLUGINS=feather; None: the plugin is not named (off)."""
    schedule_policy: str = "fcfs"
    """SGLang's own `--schedule-policy` (under Feather too: Feather orders on top of it)."""
    policy_options: dict[str, Any] = field(default_factory=dict)
    policy_state: str | None = None
    state_every_s: float | None = None
    chunk_tokens: int | None = None
    extra_policies: dict[str, str] = field(default_factory=dict)
    """Policies to register by name ("module:Class") before the plugin loads."""
    model: TinyLlamaSpec = TINY_LLAMA
    # SGLang's `ServerArgs` fields of the same names (SERVER_ARGS): KV pool tokens, running
    # cap, tokens per prefill chunk, prefill token budget per step, tokens per KV page,
    # metrics
    max_total_tokens: int = 8192
    max_running_requests: int = 64
    chunked_prefill_size: int = 512
    max_prefill_tokens: int = 4096
    page_size: int = 1
    enable_metrics: bool = False
    """SGLang's `--enable-metrics`: its series (and Feather's) in prometheus_client's
    multiprocess files; `env` must then name `PROMETHEUS_MULTIPROC_DIR`, as its launcher
    sets it."""
    overlap: bool = False
    """SGLang's overlap event loop (`event_loop_overlap`) instead of `event_loop_normal`."""
    step_cost: tuple[str, str] | None = None
    """(hardware profile, model profile) the stand-in forward sleeps by; None: no sleep."""
    run_timeout_s: float = 120.0
    seed: int = 0
    env: dict[str, str] = field(default_factory=dict)
    """More environment for the scheduler process (SGLang's own `SGLANG_*` switches)."""
    log_level: str = "ERROR"
    """Level of SGLang's loggers in the scheduler process (its retraction notices are
    WARNINGs; the report counts retractions either way)."""


class LoopCounters(Protocol):
    """What the client reads of the engine's loop probe (`sglang_engine._LoopProbe`): its
    running counters, taken before and after each run to give that run's share."""

    def mark(self) -> dict[str, Any]: ...
