"""What `feather probe` measures: the device, model, grid, kernels and timing settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from feather_sched.cost.composition import Composition

DEFAULT_MODEL = {"cuda": "llama-3-8b", "cpu": "kv-bound"}
"""Model whose shapes the probe builds: Llama-3-8B on a GPU; on a CPU the kv-bound model (the
real-engine model of the paper's effect on a CPU, 4 KiB of KV per token per layer)."""


@dataclass
class ProbeSpec:
    device: str = "cuda"
    model: str | None = None
    """Model profile (name or JSON); None: DEFAULT_MODEL[device]."""
    quick: bool = False
    base_hardware: str | None = None
    """Hardware profile whose peak figures the fit keeps; None: from the device name."""
    dtype: str | None = None
    """bfloat16 / float16 / float32; None: bfloat16 on cuda, float32 on cpu."""
    block_size: int = 16
    warmup: int | None = None
    """Untimed runs before the timed ones; None: 2 on cuda (after graph capture), 1 on cpu."""
    reps: int | None = None
    """Timed runs per composition; None: 5."""
    holdout_every: int = 4
    cuda_graph: bool = True
    budget_s: float | None = None
    """Stop measuring further compositions after this many seconds (None: no limit)."""
    memory_fraction: float = 0.85
    """Share of free device memory (cuda) or available RAM (cpu) the probe may use."""
    kernels: list[str] | None = None
    """Attention kernels to time (attention.KERNELS); None: by device."""
    grid: str | None = None
    """A grid of layout.GRIDS by name; None: the device's (quick) grid."""
    threads: int | None = None
    """torch CPU threads (--device cpu); None: 1. On a shared machine torch's multi-thread ops
    wait for the cores other processes hold, and the step times become mostly that wait."""
    seed: int = 0
    compositions: list[Composition] | None = field(default=None, repr=False)
    """Override the grid (tests)."""

    def resolved_model(self) -> str:
        return self.model or DEFAULT_MODEL[self.device]

    def resolved_reps(self) -> int:
        return self.reps or 5

    def resolved_warmup(self) -> int:
        return self.warmup if self.warmup is not None else (2 if self.device == "cuda" else 1)

    def resolved_budget(self) -> float | None:
        """`--quick` on a CPU stops after 180 s of measuring (the smoke run stays short on a
        loaded machine); otherwise only an explicit budget."""
        if self.budget_s is None and self.quick and self.device == "cpu":
            return 180.0
        return self.budget_s

    def grid_name(self) -> str:
        return self.grid or self.device + ("-quick" if self.quick else "")


def torch_dtype(spec: ProbeSpec):
    import torch

    name = spec.dtype or ("bfloat16" if spec.device == "cuda" else "float32")
    try:
        return getattr(torch, name)
    except AttributeError:
        raise ValueError(f"unknown dtype {name!r}") from None
