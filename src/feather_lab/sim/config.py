"""Engine settings for the simulator, with vLLM V1's defaults."""

from __future__ import annotations

from dataclasses import dataclass

from feather_lab.sim.scheduler_cpu import check_mode
from feather_sched.cost.profiles import HardwareProfile, ModelProfile

SEES_OUTPUT = ("cap", "exact")
"""What the scheduler may know of an output (`EngineConfig.scheduler_sees_output`)."""


@dataclass(frozen=True)
class EngineConfig:
    """Continuous-batching engine limits.

    Defaults follow vLLM V1 (`vllm/config/scheduler.py`, `cache.py`): max_num_seqs 256,
    max_num_batched_tokens 8192 with chunked prefill, 16-token KV blocks, prefix caching on,
    gpu_memory_utilization 0.9. `num_kv_blocks=None` sizes the KV cache from the hardware
    profile's memory: utilization x memory - weights - activation reserve.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 2e9
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    index_chunk_size: int = 64
    """CHT chunk in tokens, rounded down to whole KV blocks (at least one), as the vLLM
    adapter rounds `FEATHER_CHUNK_TOKENS`; the chain comes from the block hashes."""
    check_invariants_every: int = 0
    """Run the KV cache's full invariant check every N steps (0: only at the end)."""
    max_steps: int = 5_000_000
    scheduler_cpu: str = "off"
    """The scheduler's CPU on the clock (`sim.sched_cpu`): `model` (fitted from SGLang's own
    code, `sim.scheduler_cpu`), `measured` (the policy's Python as timed here) or `off`
    (none: the default here; `feather bench` asks for `model`)."""
    async_scheduling: bool = True
    """How that CPU meets the GPU: True, a step takes the longer of the two (vLLM's async
    scheduling and SGLang's overlap loop, both on by default on a GPU); False, their sum
    (a synchronous loop)."""

    scheduler_sees_output: str = "cap"
    """What the scheduler knows of each request's output: `cap`, the client's `max_tokens`
    (the true length only under `ignore_eos`), as a real engine; `exact`, the true length of
    every request (an oracle's knowledge)."""

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "index_chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"EngineConfig.num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("EngineConfig.gpu_memory_utilization must be in (0, 1]")
        check_mode(self.scheduler_cpu)
        if self.scheduler_sees_output not in SEES_OUTPUT:
            raise ValueError(
                f"EngineConfig.scheduler_sees_output {self.scheduler_sees_output!r}: valid: "
                f"{', '.join(SEES_OUTPUT)}"
            )
        if self.check_invariants_every < 0:
            raise ValueError("EngineConfig.check_invariants_every must be >= 0")

    def kv_blocks(self, hardware: HardwareProfile, model: ModelProfile) -> int:
        """KV blocks the engine gets: explicit, or what fits in device memory."""
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        if hardware.memory_bytes <= 0:
            raise ValueError(
                f"hardware profile {hardware.name!r} has no memory_bytes; "
                "set EngineConfig.num_kv_blocks explicitly"
            )
        free = (
            hardware.memory_bytes * self.gpu_memory_utilization
            - model.weight_bytes
            - self.activation_reserve_bytes
        )
        blocks = int(free // (model.kv_bytes_per_token * self.block_size))
        if blocks < 1:
            raise ValueError(
                f"model {model.name!r} ({model.weight_bytes / 1e9:.1f} GB of weights) leaves no "
                f"room for KV cache on {hardware.name!r}"
            )
        return blocks
