"""A decode batch's composition: the unit both calibrations measure.

`batch` requests over `prefixes` distinct prefixes of `prefix_len` tokens, each with
`suffix_len` tokens of its own. `feather probe` times kernels on it without an engine
(probe/layout.py lays it out as vLLM's paged KV); `feather calibrate` runs it through a real
engine, with decode steps, late arrivals (mixed steps) and the batch order on top.
One class, so a grid point means the same batch in both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Composition:
    batch: int
    prefixes: int
    prefix_len: int
    suffix_len: int
    decode_steps: int = 16
    late: int = 0
    """Requests held back and added one per step once the others decode: mixed steps
    (decodes plus one prefill), the shape of most steps of a busy server."""
    grouped: bool = False
    """Requests of one prefix adjacent in the batch (as prefix-grouped admission leaves
    them) instead of interleaved round-robin (as a shuffled queue leaves them): a kernel
    that walks the batch in order re-reads a prefix while it is still in cache."""

    def __post_init__(self) -> None:
        if not (1 <= self.prefixes <= self.batch):
            raise ValueError(f"need 1 <= prefixes <= batch, got {self.prefixes}, {self.batch}")
        if self.prefix_len < 0 or self.suffix_len < 1:
            raise ValueError("need prefix_len >= 0 and suffix_len >= 1")

    @property
    def label(self) -> str:
        late = f"-L{self.late}" if self.late else ""
        order = "-grouped" if self.grouped and self.prefixes > 1 else ""
        return f"B{self.batch}-G{self.prefixes}-P{self.prefix_len}-S{self.suffix_len}{late}{order}"

    @property
    def context_len(self) -> int:
        return self.prefix_len + self.suffix_len

    def prefix_of(self, i: int) -> int:
        """Which prefix request i carries: adjacent runs when grouped, else round-robin."""
        return i * self.prefixes // self.batch if self.grouped else i % self.prefixes

    def num_blocks(self, block_size: int) -> int:
        """Physical blocks its paged layout uses (shared prefix blocks counted once)."""
        own = -(-self.suffix_len // block_size)
        return self.prefixes * (self.prefix_len // block_size) + self.batch * own
