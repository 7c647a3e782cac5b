"""What `feather bench --engine vllm` runs: its spec, the KV regimes, and the bench workloads
scaled to the built-in random-weight engine models (`ENGINE_SCALES`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from feather_lab.workloads import make_workload
from feather_lab.workloads.presets import PRESETS
from feather_sched.request import Request

BASELINE = "vllm"
"""Row name of vLLM's own scheduler (FCFS), the baseline of `vs_fcfs`."""
BLOCK_SIZE = 32
"""Tokens per KV block in the harness's engines: the real-engine bench (vLLM, SGLang's loop),
`feather vllm-bench` and the replay's `vllm serve` (vLLM's CPU attention needs a multiple of
32); with the two below, the setup all three start from."""
MAX_NUM_SEQS = 256
"""Running requests at most in the harness's engines."""
MAX_NUM_BATCHED_TOKENS = 4096
"""Tokens scheduled per step at most in the harness's engines."""


EOS_TERMINALS = 8
"""Terminal tokens of a built-in model's EOS variant: ring gaps of ~64 of its 508 walked ids,
so outputs end at 1 to ~130 tokens (mean ~50 under a 128-token cap, ~35 under 64)."""


@dataclass(frozen=True)
class KvScenario:
    name: str
    num_blocks: int


@dataclass(frozen=True)
class EngineScale:
    """Bench settings sized for one built-in engine model: its workloads (generator name and
    settings), the default ones, the KV scenarios and the context length they need."""

    workloads: dict[str, tuple[str, dict[str, Any]]]
    default_workloads: tuple[str, ...]
    scenarios: tuple[KvScenario, ...]
    max_model_len: int


def _workloads(model: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """The model's workloads from the one preset table (workloads/presets.py)."""
    return {name: (p.base, p.overrides) for name, p in PRESETS[model].items()}


# The simulator suite's shapes, scaled to the tiny model (max_model_len 1024, vocab 512).
_TINY = EngineScale(
    workloads=_workloads("tiny-llama"),
    default_workloads=("shared-prefix", "no-sharing"),
    # kv-pressure: 96 blocks of 32 tokens hold ~5 requests of distinct prefixes, or a
    # group of 16 sharing one.
    scenarios=(KvScenario("kv-pressure", 96), KvScenario("no-pressure", 4096)),
    max_model_len=1024,
)

# The KV-bound model: decode reads dominate, so the batch's prefix mix sets the step time.
_KV_BOUND = EngineScale(
    workloads=_workloads("kv-bound"),
    default_workloads=("paper-32g", "paper-4g", "no-sharing"),
    # kv-pressure: 1,024 blocks hold ~15 requests of distinct prefixes (68 blocks each) or
    # ~9 whole groups of 8 (100 blocks a group); no-pressure holds every workload whole.
    scenarios=(KvScenario("kv-pressure", 1024), KvScenario("no-pressure", 8192)),
    max_model_len=4096,
)

ENGINE_SCALES: dict[str, EngineScale] = {"tiny-llama": _TINY, "kv-bound": _KV_BOUND}
"""Bench settings per built-in engine model (`--model NAME`); a model directory uses tiny's."""


def engine_scale(model: str | None) -> EngineScale:
    """The scale of a built-in model name; a model directory (or None) gets tiny-llama's."""
    return ENGINE_SCALES.get(model or "tiny-llama", _TINY)


@dataclass(frozen=True)
class EngineBenchSpec:
    """What every real-engine bench (vLLM, SGLang's loop) takes, under one name each."""

    workloads: Sequence[str] | None = None
    """None: the model scale's default workloads."""
    policies: Sequence[str] = ()
    model: str | None = None
    """A built-in engine model (`ENGINE_SCALES`: tiny-llama, kv-bound), built at run time, or
    an HF model directory; None is tiny-llama."""
    scenarios: Sequence[KvScenario] | None = None
    """None: the model scale's KV scenarios."""
    block_size: int = BLOCK_SIZE
    """Tokens per KV block (SGLang: the KV pool is num_blocks x block_size tokens)."""
    max_num_seqs: int = MAX_NUM_SEQS
    """Running requests at most (SGLang: `max_running_requests`)."""
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    """Tokens scheduled per step at most (SGLang: its prefill chunk and prefill budget)."""
    repeats: int = 3
    """Interleaved runs of every configuration; the rows are their medians."""
    seed: int = 0
    policy_state: Path | None = None
    """The `feather` bandit's table: loaded before each feather run if the file exists and
    saved after it, so the bandit learns across runs and scenarios as a deployment would."""


@dataclass(frozen=True)
class VllmBenchSpec(EngineBenchSpec):
    policies: Sequence[str] = ("grouped",)
    max_model_len: int | None = None
    """None: the model scale's context length."""
    dtype: str = "auto"
    policy_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    async_scheduling: bool = False
    """Run vLLM's async scheduling (the GPU default: two batches in flight, AsyncScheduler and
    FeatherAsyncScheduler), also on CPU where vLLM turns it off by default."""
    drop_overlong: bool = False
    """Drop requests longer than `max_model_len` (counted in the rows) instead of refusing
    the run: vLLM would reject them."""
    ignore_eos: bool = True
    """True: every request runs to its workload's output length (the scheduler could know it).
    False: the length is a cap (`max_tokens`) and the output ends at the model's EOS; a
    built-in model is then written with `EOS_TERMINALS` (harness/eos_walk.py) so its greedy
    outputs end at spread-out lengths under the cap."""
    steps_out: Path | None = None
    """A JSONL step log (`bench.steplog`) of every Feather-engine run (vLLM's own scheduler
    runs without a policy, so its runs log nothing)."""

    @property
    def scale(self) -> EngineScale:
        return engine_scale(self.model)

    def resolved(self) -> VllmBenchSpec:
        """This spec with every None filled from the model's scale."""
        scale = self.scale
        return dataclasses.replace(
            self,
            workloads=tuple(self.workloads or scale.default_workloads),
            scenarios=tuple(self.scenarios or scale.scenarios),
            max_model_len=self.max_model_len or scale.max_model_len,
        )

    def validate(self) -> None:
        from feather_sched.policies.registry import policy_names

        bad = [p for p in self.policies if p not in policy_names()]
        if bad:
            raise ValueError(
                f"unknown policies {bad} for --engine vllm; valid: {', '.join(policy_names())}"
            )
        known = self.scale.workloads
        unknown = [w for w in self.workloads or () if w not in known]
        if unknown:
            raise ValueError(
                f"workloads {unknown} have no engine-sized settings for model "
                f"{self.model or 'tiny-llama'!r}; valid: {', '.join(known)}"
            )
        custom = self.model is not None and self.model not in ENGINE_SCALES
        if custom and not (Path(str(self.model)) / "config.json").is_file():
            raise ValueError(
                f"--model {self.model!r} is neither a built-in engine model "
                f"({', '.join(ENGINE_SCALES)}) nor a model directory with a config.json"
            )
        if self.repeats < 1 or self.scenarios == ():
            raise ValueError("need repeats >= 1 and at least one KV scenario")


def engine_workload(
    name: str, vocab_size: int, seed: int, scale: EngineScale = _TINY, arrival: str | None = None
) -> list[Request]:
    """A named workload at engine scale; ids 4.. only (0-3 are the tokenizer's specials).
    `arrival` (an arrival spec, e.g. "poisson:20") replaces the preset's arrivals."""
    base, settings = scale.workloads[name]
    if arrival is not None:
        settings = {**settings, "arrival": arrival}
    requests = make_workload(base, **settings, vocab_size=vocab_size).generate(seed)
    for r in requests:
        r.prompt = np.maximum(r.prompt, 4).astype(np.int32)
    return requests


# vLLM CPU binds one OMP thread per core and spin-waits between ops; on a small machine shared
# with other work a preempted OMP thread stalls every op. One unbound thread is both faster and
# steadier for small models. Set them yourself to override (before torch is imported).
