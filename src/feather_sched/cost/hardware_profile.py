"""Hardware profiles: one accelerator's peak figures plus the constants calibration fits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from feather_sched.cost.profile_schema import (
    Checks,
    ProfileIO,
    boolean,
    fraction,
    fraction0,
    known_provenance,
    non_negative,
    positive,
    text,
)


@dataclass(frozen=True)
class HardwareProfile(ProfileIO):
    """Peak figures of one accelerator plus the parameters calibration fits.

    ``cache_bytes`` is the last-level on-chip cache the KV reuse model uses (L2 on
    GPUs, L3 on CPUs). The fitted parameters are the four after it and the three
    defaulted ones (`feather calibrate` and `feather probe` fit them).
    """

    name: str
    mem_bandwidth_Bps: float
    """Peak memory bandwidth, bytes per second (the datasheet's figure)."""
    peak_flops: float
    """Peak dense FLOP/s at the model's dtype (the datasheet's figure)."""
    cache_bytes: float
    """The last-level cache the KV reads of a step can hit (GPU L2, CPU L3), bytes."""
    bandwidth_efficiency: float
    """Achieved fraction of `mem_bandwidth_Bps`."""
    compute_efficiency: float
    """Achieved fraction of `peak_flops`."""
    cache_efficiency: float
    """Fraction of `cache_bytes` that shared KV may occupy."""
    step_overhead_s: float
    """Fixed seconds per engine step."""
    reuse_exponent: float = 1.0
    """How fast cache reuse falls off past capacity (the step model's h = (C / W) ** it)."""
    per_seq_overhead_s: float = 0.0
    """Extra seconds per scheduled sequence."""
    cache_read_cost: float = 0.0
    """Time of a KV read that hits the cache, as a fraction of one from memory: 0 = free, as
    on a GPU whose L2 bandwidth dwarfs HBM's; a CPU's L3 is only ~3x faster than its DRAM."""
    sequential_attention: bool = False
    """The attention kernel walks the batch's sequences in order (a CPU thread), so reuse
    depends on what was read since a block's last reader (see the step model)."""
    memory_bytes: float = 0.0
    """Device memory (HBM) in bytes; the simulator sizes the KV cache from it. 0 = unknown."""
    description: str = ""
    provenance: str = "estimate"
    """`measured`, `derived` or `estimate` (`PROVENANCES`): how far to trust its numbers. A
    profile file without it is an estimate; `feather probe` and `feather calibrate` write
    `measured` into the profiles they fit."""
    provenance_note: str = ""
    """Where the constants come from: the record, date, command and fit error (measured), the
    measured profile and why it transfers (derived), or what is assumed (estimate)."""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    _KIND: ClassVar[str] = "hardware"
    _CHECKS: ClassVar[Checks] = {
        "mem_bandwidth_Bps": positive,
        "peak_flops": positive,
        "cache_bytes": non_negative,
        "bandwidth_efficiency": fraction,
        "compute_efficiency": fraction,
        "cache_efficiency": fraction0,
        "step_overhead_s": non_negative,
        "reuse_exponent": positive,
        "per_seq_overhead_s": non_negative,
        "cache_read_cost": fraction0,
        "sequential_attention": boolean,
        "memory_bytes": non_negative,
        "description": text,
        "provenance": known_provenance,
        "provenance_note": text,
    }
    #: Fields ``feather calibrate`` fits against measured step times.
    FIT_FIELDS: ClassVar[tuple[str, ...]] = (
        "bandwidth_efficiency",
        "compute_efficiency",
        "cache_efficiency",
        "reuse_exponent",
        "step_overhead_s",
        "per_seq_overhead_s",
        "cache_read_cost",
    )

    @property
    def effective_bandwidth_Bps(self) -> float:
        return self.mem_bandwidth_Bps * self.bandwidth_efficiency

    @property
    def effective_flops(self) -> float:
        return self.peak_flops * self.compute_efficiency

    @property
    def usable_cache_bytes(self) -> float:
        return self.cache_bytes * self.cache_efficiency

    @property
    def label(self) -> str:
        """`name (provenance)`, as bench headers and listings show a profile."""
        return f"{self.name} ({self.provenance})"
