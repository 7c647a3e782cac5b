"""Composition grid and paged KV layout (numpy only, no torch).

A composition is a decode batch: `batch` requests over `prefixes` distinct prefixes of
`prefix_len` tokens (request i carries prefix i % prefixes, interleaved as a shuffled queue
leaves them), each with `suffix_len` tokens of its own (the token decoded this step included).
Its layout is vLLM's: a pool of physical KV blocks of `block_size` tokens and one block table
per request. Requests that share a prefix point at the same physical prefix blocks; suffix
blocks are private. Physical block ids are a seeded permutation (a free list after some
traffic is not in order), so sharing, not address order, is what differs between batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from feather_sched.cost import BatchShape
from feather_sched.cost.composition import Composition


@dataclass(frozen=True)
class Grid:
    """Batch sizes x distinct-prefix counts x prefix lengths. `group_counts` None: for each
    batch {1, batch // 8, batch} (one prefix, a few, all distinct)."""

    batches: tuple[int, ...]
    prefix_lens: tuple[int, ...]
    suffix_len: int = 32
    group_counts: tuple[int, ...] | None = None

    def groups(self, batch: int) -> list[int]:
        if self.group_counts is None:
            return sorted({1, max(1, batch // 8), batch})
        return sorted({g for g in self.group_counts if g <= batch} | {batch})

    def compositions(self) -> list[Composition]:
        return [
            Composition(b, g, p, self.suffix_len)
            for b in self.batches
            for p in self.prefix_lens
            for g in self.groups(b)
        ]


GRIDS: dict[str, Grid] = {
    # `feather calibrate`'s kind of grid at GPU scale: batch 1-512, 1 to all-distinct
    # prefixes, prefixes 512-16,384 tokens (a 16K prefix is 64 MiB of Llama-3-8B KV per
    # layer, past the 50 MiB L2 of an H100/H200; 512 tokens is 2 MiB).
    "cuda": Grid((1, 8, 32, 128, 512), (512, 2048, 8192, 16384)),
    "cuda-quick": Grid((1, 16, 128), (512, 4096)),
    # CPU (the kv-bound model, 4 KiB of KV per token per layer, vs a 32 MiB L3).
    "cpu": Grid((1, 4, 16, 32, 64), (512, 2048, 4096), 16, (1, 2, 4, 8)),
    "cpu-quick": Grid((1, 4, 16), (512, 2048), 16, (1, 4)),
    # A dry run of the whole pipeline in seconds (tiny-llama; the Triton kernel interpreted).
    "smoke": Grid((1, 4), (32, 64), 16, (1, 2)),
}


@dataclass(frozen=True)
class PagedLayout:
    """Block tables of one composition (numpy int32), ready to copy to a device."""

    composition: Composition
    block_size: int
    block_tables: np.ndarray
    """[batch, max_blocks] physical block ids (rows padded with their last block)."""
    context_lens: np.ndarray
    """[batch] tokens each request attends to (its whole context, this step's token too)."""
    slots: np.ndarray
    """[batch] flat KV slot (block * block_size + offset) this step's token is written to."""
    num_blocks: int
    """Physical blocks in use; ids are < num_blocks."""

    def shape(self) -> BatchShape:
        """The step's exact BatchShape, from the block tables (shared blocks counted by
        reference, as `feather calibrate` reads them from vLLM's)."""
        n = self.context_lens
        tables = [
            self.block_tables[i, : -(-int(n[i]) // self.block_size)].tolist() for i in range(len(n))
        ]
        return BatchShape.from_block_tables(tables, self.block_size, n.tolist())


def build_layout(comp: Composition, block_size: int = 16, seed: int = 0) -> PagedLayout:
    if comp.prefix_len % block_size:
        raise ValueError(
            f"prefix_len {comp.prefix_len} must be a multiple of block_size {block_size} "
            "(only whole blocks are shared)"
        )
    pb = comp.prefix_len // block_size
    own = -(-comp.suffix_len // block_size)
    total = comp.num_blocks(block_size)
    perm = np.random.default_rng(seed).permutation(total).astype(np.int32)
    logical = np.empty((comp.batch, pb + own), dtype=np.int64)
    nxt = comp.prefixes * pb
    for i in range(comp.batch):
        g = comp.prefix_of(i)
        logical[i, :pb] = np.arange(g * pb, (g + 1) * pb)
        logical[i, pb:] = np.arange(nxt, nxt + own)
        nxt += own
    tables = perm[logical]
    ctx = comp.context_len
    last = ctx - 1
    slots = tables[:, last // block_size].astype(np.int64) * block_size + last % block_size
    return PagedLayout(
        composition=comp,
        block_size=block_size,
        block_tables=np.ascontiguousarray(tables, dtype=np.int32),
        context_lens=np.full(comp.batch, ctx, dtype=np.int32),
        slots=slots,
        num_blocks=total,
    )
