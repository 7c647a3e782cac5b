"""Step-time model: how long one engine iteration takes on given hardware.

A roofline (`max(compute, memory)` plus fixed and per-sequence overheads) with a KV-locality
term: repeat reads of shared prefix blocks hit the cache while one layer's shared working set
fits it (on a sequential CPU kernel: the KV streamed between two reads of a block), the rest
goes to memory. An ideal prefix-sharing kernel reads each distinct block once. The formulas and
their assumptions: docs/simulator.md, "The step-time model"."""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import Enum

from feather_sched.cost.profiles import (
    HardwareProfile,
    ModelProfile,
    load_hardware,
    load_model,
)

__all__ = ["BatchShape", "KernelMode", "StepCost", "StepCostModel"]


class KernelMode(str, Enum):
    """Which attention kernel the step model assumes."""

    PAGED = "paged"
    """Plain paged attention: every sequence reads its whole context; cache reuse model."""
    IDEAL = "ideal"
    """Ideal prefix-sharing kernel: each distinct KV block is read once per step."""


@dataclass(frozen=True, slots=True)
class BatchShape:
    """One engine iteration, summarised by counts (no per-block lists).

    All counts are tokens except ``num_decode`` / ``num_prefill_seqs`` (sequences).

    - ``num_decode``: decode sequences (one new token each).
    - ``num_prefill_tokens``: prompt tokens computed this step (chunked prefill allowed).
    - ``prefill_attn_pairs``: sum over those prefill tokens of the context length each
      attends to (attention FLOPs); 0 if unknown.
    - ``logical_kv_tokens``: sum over the batch's sequences of the context tokens each
      reads this step.
    - ``unique_kv_tokens``: distinct KV tokens read this step (distinct blocks x block
      size, or exact token counts).
    - ``shared_unique_kv_tokens``: distinct tokens in blocks that >= 2 sequences of the
      batch read.
    - ``shared_logical_kv_tokens``: logical reads hitting those shared blocks (sum over
      shared blocks of refcount x tokens in the block).
    - ``num_prefill_seqs``: sequences with prefill work this step (only for the
      per-sequence overhead; 0 if unknown).
    - ``shared_span_tokens``: mean context tokens the batch reads, in batch order, between
      two consecutive reads of a shared block (over all repeat reads; 0 if none). Only
      sequential-attention hardware uses it.

    Consistent counts satisfy ``unique = (logical - shared_logical) + shared_unique``;
    :meth:`validate` checks the weaker invariants that any sensible estimate meets.
    """

    num_decode: int = 0
    num_prefill_tokens: int = 0
    prefill_attn_pairs: int = 0
    logical_kv_tokens: int = 0
    unique_kv_tokens: int = 0
    shared_unique_kv_tokens: int = 0
    shared_logical_kv_tokens: int = 0
    num_prefill_seqs: int = 0
    shared_span_tokens: float = 0.0

    def validate(self) -> BatchShape:
        """Raise ``ValueError`` on counts that cannot describe a real batch; return self."""
        for name in self.__slots__:
            v = getattr(self, name)
            if v < 0:
                raise ValueError(f"BatchShape.{name} must be >= 0, got {v}")
        if self.shared_unique_kv_tokens > self.shared_logical_kv_tokens:
            raise ValueError("BatchShape: shared_unique_kv_tokens > shared_logical_kv_tokens")
        if self.shared_logical_kv_tokens > self.logical_kv_tokens:
            raise ValueError("BatchShape: shared_logical_kv_tokens > logical_kv_tokens")
        if self.shared_unique_kv_tokens > self.unique_kv_tokens:
            raise ValueError("BatchShape: shared_unique_kv_tokens > unique_kv_tokens")
        return self

    @classmethod
    def shared_prefix_decode(
        cls, group_sizes: Sequence[int], prefix_len: int, suffix_len: int = 0
    ) -> BatchShape:
        """A decode-only batch: group g has ``group_sizes[g]`` sequences that share a
        ``prefix_len``-token prefix, and each sequence has ``suffix_len`` tokens of its
        own. Groups of size 1 share nothing. Token-exact (no block rounding); a group's
        sequences are adjacent in the batch."""
        if prefix_len < 0 or suffix_len < 0 or any(n < 0 for n in group_sizes):
            raise ValueError("group sizes and lengths must be >= 0")
        sizes = [n for n in group_sizes if n > 0]
        n_seq = sum(sizes)
        shared_groups = [n for n in sizes if n >= 2]
        return cls(
            num_decode=n_seq,
            logical_kv_tokens=n_seq * (prefix_len + suffix_len),
            unique_kv_tokens=len(sizes) * prefix_len + n_seq * suffix_len,
            shared_unique_kv_tokens=len(shared_groups) * prefix_len,
            shared_logical_kv_tokens=sum(shared_groups) * prefix_len,
            shared_span_tokens=float(prefix_len + suffix_len) if shared_groups else 0.0,
        )

    @classmethod
    def from_block_tables(
        cls,
        block_tables: Sequence[Sequence[Hashable]],
        block_size: int,
        context_lens: Sequence[int] | None = None,
        *,
        num_decode: int | None = None,
        num_prefill_tokens: int = 0,
        prefill_attn_pairs: int = 0,
        num_prefill_seqs: int = 0,
    ) -> BatchShape:
        """Reference construction from explicit block tables (per-block, slow).

        ``block_tables[i]`` lists the block ids sequence i reads this step (its whole
        context); ``context_lens[i]`` is its context length in tokens (default: full
        blocks). A block's token count is the largest number of valid tokens any reader
        sees in it. ``num_decode`` defaults to ``len(block_tables) - num_prefill_seqs``.
        Use it in tests, in calibration, and to cross-check a simulator's incremental
        counts.
        """
        if block_size <= 0:
            raise ValueError("block_size must be > 0")
        if context_lens is not None and len(context_lens) != len(block_tables):
            raise ValueError("context_lens must have one entry per block table")
        refs: dict[Hashable, int] = {}
        tok_sum: dict[Hashable, int] = {}
        tok_max: dict[Hashable, int] = {}
        last_read: dict[Hashable, int] = {}  # block -> tokens streamed before its last read
        streamed = span_sum = repeats = 0
        for i, blocks in enumerate(block_tables):
            ctx = len(blocks) * block_size if context_lens is None else context_lens[i]
            if not (len(blocks) - 1) * block_size < ctx <= len(blocks) * block_size:
                raise ValueError(
                    f"sequence {i}: context length {ctx} does not fit {len(blocks)} blocks "
                    f"of {block_size}"
                )
            for j, b in enumerate(blocks):
                n = min(block_size, ctx - j * block_size)
                refs[b] = refs.get(b, 0) + 1
                tok_sum[b] = tok_sum.get(b, 0) + n
                if n > tok_max.get(b, 0):
                    tok_max[b] = n
                at = streamed + j * block_size
                if b in last_read:
                    span_sum += at - last_read[b]
                    repeats += 1
                last_read[b] = at
            streamed += ctx
        shared = [b for b, r in refs.items() if r >= 2]
        return cls(
            num_decode=len(block_tables) - num_prefill_seqs if num_decode is None else num_decode,
            num_prefill_tokens=num_prefill_tokens,
            prefill_attn_pairs=prefill_attn_pairs,
            logical_kv_tokens=sum(tok_sum.values()),
            unique_kv_tokens=sum(tok_max.values()),
            shared_unique_kv_tokens=sum(tok_max[b] for b in shared),
            shared_logical_kv_tokens=sum(tok_sum[b] for b in shared),
            num_prefill_seqs=num_prefill_seqs,
            shared_span_tokens=span_sum / repeats if repeats else 0.0,
        )


@dataclass(frozen=True, slots=True)
class StepCost:
    """Itemised result of :meth:`StepCostModel.breakdown` (seconds, bytes, FLOPs)."""

    compute_s: float
    memory_s: float
    overhead_s: float
    total_s: float
    flops: float
    weight_bytes: float
    """Weight bytes streamed this step."""
    kv_bytes_read: float
    """KV bytes read from HBM/DRAM (after deduplication and cache hits)."""
    kv_bytes_written: float
    logical_kv_bytes: float
    """KV bytes the batch reads logically (every sequence its whole context)."""
    cache_hit_fraction: float
    """Fraction of logical KV reads that did not go to memory (cache hits in paged
    mode, reads deduplicated by the kernel in ideal mode); 0 when nothing is read."""
    shared_hit_rate: float
    """Hit rate ``h`` of repeated reads of shared blocks under the reuse model."""

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``: which roofline term set the step time."""
        return "compute" if self.compute_s > self.memory_s else "memory"


class StepCostModel:
    """Predicts engine step times for one (hardware, model, kernel) combination.

    ``hardware`` / ``model`` may be profiles or anything ``load_hardware`` /
    ``load_model`` accept (a built-in name or a JSON path). Profiles are frozen;
    to try other parameters, build a new model (see :meth:`replace`).
    """

    __slots__ = (
        "_apf",
        "_cache_tokens",
        "_crc",
        "_exp",
        "_fpt",
        "_ideal",
        "_inv_bw",
        "_inv_flops",
        "_kvb",
        "_ovh",
        "_seq",
        "_seq_ovh",
        "_w",
        "hardware",
        "kernel",
        "model",
    )

    def __init__(
        self,
        hardware: HardwareProfile | str | os.PathLike[str],
        model: ModelProfile | str | os.PathLike[str],
        kernel: KernelMode | str = KernelMode.PAGED,
    ) -> None:
        hw = hardware if isinstance(hardware, HardwareProfile) else load_hardware(hardware)
        m = model if isinstance(model, ModelProfile) else load_model(model)
        self.hardware: HardwareProfile = hw
        self.model: ModelProfile = m
        try:
            self.kernel: KernelMode = KernelMode(kernel)
        except ValueError:
            valid = ", ".join(k.value for k in KernelMode)
            raise ValueError(f"unknown kernel {kernel!r}; valid: {valid}") from None
        self._ideal = self.kernel is KernelMode.IDEAL
        # Everything step_time needs, pre-multiplied into plain floats.
        self._inv_flops = 1.0 / hw.effective_flops
        self._inv_bw = 1.0 / hw.effective_bandwidth_Bps
        self._w = float(m.weight_bytes_per_step)
        self._kvb = float(m.kv_bytes_per_token)
        self._fpt = float(m.flops_per_token)
        self._apf = float(m.attn_flops_per_pair)
        # Usable cache expressed in tokens of one layer's KV: W <= C  <=>  su <= this.
        self._cache_tokens = hw.usable_cache_bytes / m.kv_bytes_per_token_per_layer
        self._exp = float(hw.reuse_exponent)
        self._crc = 0.0 if self._ideal else float(hw.cache_read_cost)
        self._seq = bool(hw.sequential_attention)
        self._ovh = float(hw.step_overhead_s)
        self._seq_ovh = float(hw.per_seq_overhead_s)

    @property
    def cache_capacity_tokens(self) -> float:
        """Shared prefix tokens whose one-layer KV fits the usable cache."""
        return self._cache_tokens

    def replace(
        self,
        hardware: HardwareProfile | None = None,
        model: ModelProfile | None = None,
        kernel: KernelMode | str | None = None,
    ) -> StepCostModel:
        """A new model with some of hardware, model, kernel swapped."""
        return StepCostModel(
            self.hardware if hardware is None else hardware,
            self.model if model is None else model,
            self.kernel if kernel is None else kernel,
        )

    def __repr__(self) -> str:
        return (
            f"StepCostModel(hardware={self.hardware.name!r}, model={self.model.name!r}, "
            f"kernel={self.kernel.value!r})"
        )

    @property
    def order_sensitive(self) -> bool:
        """Whether the batch's order matters (sequential attention): hosts then fill
        ``BatchShape.shared_span_tokens``."""
        return self._seq and not self._ideal

    def working_set_tokens(self, shape: BatchShape) -> float:
        """Tokens of one layer's KV that must stay cached for repeat reads to hit."""
        return shape.shared_span_tokens if self._seq else shape.shared_unique_kv_tokens

    def shared_hit_rate(self, working_set_tokens: float) -> float:
        """Cache hit rate ``h`` of repeated shared-block reads (see module docstring)."""
        if working_set_tokens <= self._cache_tokens:
            return 1.0
        return (self._cache_tokens / working_set_tokens) ** self._exp

    def kv_tokens_read(self, shape: BatchShape) -> float:
        """Tokens whose KV the step reads from memory (not from cache)."""
        if self._ideal:
            return float(shape.unique_kv_tokens)
        su = shape.shared_unique_kv_tokens
        repeats = shape.shared_logical_kv_tokens - su
        kv = float(shape.logical_kv_tokens - repeats)
        ws = self.working_set_tokens(shape)
        if repeats > 0 and ws > self._cache_tokens:
            kv += repeats * (1.0 - (self._cache_tokens / ws) ** self._exp)
        return kv

    def step_time(self, shape: BatchShape) -> float:
        """Seconds for one engine step; 0 for an empty batch. Hot path: no validation."""
        nd = shape.num_decode
        new = nd + shape.num_prefill_tokens
        if new <= 0:
            return 0.0
        logical = shape.logical_kv_tokens
        if self._ideal:
            kv = shape.unique_kv_tokens
        else:
            su = shape.shared_unique_kv_tokens
            repeats = shape.shared_logical_kv_tokens - su
            kv = logical - repeats
            ws = shape.shared_span_tokens if self._seq else su
            if repeats > 0 and ws > self._cache_tokens:
                kv += repeats * (1.0 - (self._cache_tokens / ws) ** self._exp)
        compute = (self._fpt * new + self._apf * (logical + shape.prefill_attn_pairs)) * (
            self._inv_flops
        )
        memory = (self._w + (kv + new + self._crc * (logical - kv)) * self._kvb) * self._inv_bw
        return (
            (compute if compute > memory else memory)
            + self._ovh
            + self._seq_ovh * (nd + shape.num_prefill_seqs)
        )

    def breakdown(self, shape: BatchShape) -> StepCost:
        """Itemised version of :meth:`step_time` (validates the shape)."""
        shape.validate()
        new = shape.num_decode + shape.num_prefill_tokens
        h = self.shared_hit_rate(self.working_set_tokens(shape))
        if new <= 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, h)
        logical = shape.logical_kv_tokens
        kv = self.kv_tokens_read(shape)
        flops = self._fpt * new + self._apf * (logical + shape.prefill_attn_pairs)
        compute = flops * self._inv_flops
        kv_read = kv * self._kvb
        kv_written = new * self._kvb
        hit_bytes = self._crc * max(0.0, logical - kv) * self._kvb
        memory = (self._w + kv_read + kv_written + hit_bytes) * self._inv_bw
        overhead = self._ovh + self._seq_ovh * (shape.num_decode + shape.num_prefill_seqs)
        return StepCost(
            compute_s=compute,
            memory_s=memory,
            overhead_s=overhead,
            total_s=max(compute, memory) + overhead,
            flops=flops,
            weight_bytes=self._w,
            kv_bytes_read=kv_read,
            kv_bytes_written=kv_written,
            logical_kv_bytes=logical * self._kvb,
            cache_hit_fraction=(1.0 - kv / logical) if logical > 0 else 0.0,
            shared_hit_rate=h,
        )
