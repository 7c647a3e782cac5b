"""The composition grids `feather calibrate --engine vllm` measures, per built-in model."""

from __future__ import annotations

from dataclasses import dataclass

from feather_sched.cost.composition import Composition


@dataclass(frozen=True)
class Grid:
    """A model's composition grid: batch sizes, distinct-prefix counts, prompt lengths.
    `group_counts` None means {1, batch // 8, batch} (one, a few, all distinct)."""

    batches: tuple[int, ...]
    prefix_lens: tuple[int, ...]
    suffix_lens: tuple[int, ...]
    group_counts: tuple[int, ...] | None = None
    late: bool = True
    """Also each batch >= 16 with arrivals during decode (mixed steps)."""
    grouped_counts: tuple[int, ...] = ()
    """Prefix counts also measured with each prefix's requests adjacent (longest prefix)."""
    extra: tuple[tuple[int, int, bool], ...] = ()
    """(batch, prefixes, grouped) at the longest prefix only: a few large batches."""

    def groups(self, batch: int) -> list[int]:
        if self.group_counts is None:
            return sorted({1, max(1, batch // 8), batch})
        return [g for g in self.group_counts if g <= batch]


GRIDS: dict[str, Grid] = {
    "tiny-llama": Grid((1, 4, 16, 32, 64), (128, 512, 896), (16, 64)),
    # Locality: 1 to 32 distinct 2,048-token prefixes (8 MiB of KV per layer each, against a
    # 32 MiB L3), batches 8-64, and 512-token prefixes that fit the cache however mixed.
    # The bench's FCFS batches (256 requests of 32 prefixes) are larger still: a few of
    # those at the longest prefix, where the cache-reuse term is decided.
    "kv-bound": Grid(
        (8, 16, 32, 64),
        (512, 2048),
        (16,),
        (1, 2, 4, 8, 16, 32),
        late=False,
        grouped_counts=(4, 16),
        extra=((128, 8, False), (128, 32, False), (256, 32, False), (256, 32, True)),
    ),
}
QUICK_GRID = Grid((1, 4, 16), (128, 512), (16,))


def default_compositions(
    quick: bool = False, grid: Grid = GRIDS["tiny-llama"]
) -> list[Composition]:
    """The grid's compositions, each batch with its prefix counts and lengths."""
    grid = QUICK_GRID if quick else grid
    steps = 8 if quick else 16
    out = []
    for b in grid.batches:
        for g in grid.groups(b):
            for p in grid.prefix_lens:
                for s in grid.suffix_lens:
                    out.append(Composition(b, g, p, s, steps))
                if grid.late and b >= 16:  # and the same batch with arrivals during decode
                    out.append(Composition(b, g, p, grid.suffix_lens[0], steps, late=4))
            if g in grid.grouped_counts:
                out.append(
                    Composition(
                        b, g, max(grid.prefix_lens), grid.suffix_lens[0], steps, grouped=True
                    )
                )
    longest, suffix = max(grid.prefix_lens), grid.suffix_lens[0]
    out += [Composition(b, g, longest, suffix, steps, grouped=o) for b, g, o in grid.extra]
    return out
