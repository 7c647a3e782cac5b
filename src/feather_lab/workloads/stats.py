"""Summary numbers for a request set, chiefly how much of it is shared prefix.

`shared_prefix_share`: each request's longest prefix shared with any other request, over all
prompt tokens (the room a batch-forming scheduler has). `cacheable_prefix_share`: the same
with an earlier request only (what an infinite prefix cache could hit). Both exact, from the
prompts sorted by their big-endian bytes: a prompt's best partner is a sorted neighbour, so
the work is one numpy scan per adjacent pair plus O(n log n) on ranks."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rich.table import Table

from feather_sched.request import Request

__all__ = [
    "TraceStats",
    "cacheable_prefix_lengths",
    "common_prefix_len",
    "render_stats",
    "shared_prefix_lengths",
    "trace_stats",
]


@dataclass(frozen=True)
class TraceStats:
    """Counts and sharing of a request set (see the module docstring for the two shares)."""

    num_requests: int
    prompt_tokens_total: int
    prompt_tokens_mean: float
    prompt_tokens_max: int
    output_tokens_total: int
    arrival_span_s: float
    shared_prefix_tokens: int
    shared_prefix_share: float
    cacheable_prefix_tokens: int
    cacheable_prefix_share: float


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Number of leading tokens two 1-D arrays have in common.

    Compares in growing chunks so the cost follows the common prefix, not the
    full length, when prompts diverge early.
    """
    n = min(a.size, b.size)
    start, step = 0, 64
    while start < n:
        end = min(n, start + step)
        mismatch = np.flatnonzero(a[start:end] != b[start:end])
        if mismatch.size:
            return start + int(mismatch[0])
        start, step = end, min(step * 8, 1 << 20)
    return n


def _sorted_with_adjacent_lcp(prompts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Lexicographic order of the prompts and the LCP of each sorted neighbour pair."""
    keys = [np.asarray(p).astype(">i4").tobytes() for p in prompts]
    order = np.array(sorted(range(len(prompts)), key=keys.__getitem__), dtype=np.int64)
    del keys
    adjacent = np.array(
        [
            common_prefix_len(prompts[order[k]], prompts[order[k + 1]])
            for k in range(len(order) - 1)
        ],
        dtype=np.int64,
    )
    return order, adjacent


def shared_prefix_lengths(prompts: Sequence[np.ndarray]) -> np.ndarray:
    """Per prompt, the longest prefix it shares with any other prompt (0 if alone)."""
    order, adjacent = _sorted_with_adjacent_lcp(prompts)
    best = np.zeros(len(prompts), dtype=np.int64)  # in sorted order: max LCP with a neighbour
    best[:-1] = adjacent
    best[1:] = np.maximum(best[1:], adjacent)
    result = np.empty_like(best)
    result[order] = best
    return result


class _RangeMin:
    """Sparse table: minimum of values[lo:hi] in O(1) after O(n log n) setup."""

    def __init__(self, values: np.ndarray):
        self.levels = [values]
        width = 1
        while 2 * width <= values.size:
            prev = self.levels[-1]
            self.levels.append(np.minimum(prev[:-width], prev[width:]))
            width *= 2

    def min(self, lo: int, hi: int) -> int:
        k = (hi - lo).bit_length() - 1
        level = self.levels[k]
        return int(min(level[lo], level[hi - (1 << k)]))


def cacheable_prefix_lengths(
    prompts: Sequence[np.ndarray], arrival_order: Sequence[int] | np.ndarray
) -> np.ndarray:
    """Per prompt, the longest prefix it shares with a prompt that comes earlier in
    `arrival_order` (a permutation of range(len(prompts)))."""
    n = len(prompts)
    result = np.zeros(n, dtype=np.int64)
    if n < 2:
        return result
    order, adjacent = _sorted_with_adjacent_lcp(prompts)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    table = _RangeMin(adjacent)
    seen: list[int] = []
    for i in arrival_order:
        r = int(rank[i])
        pos = bisect.bisect_left(seen, r)
        best = 0
        if pos > 0:  # nearest earlier arrival sorted before: LCP = min adjacent in between
            best = table.min(seen[pos - 1], r)
        if pos < len(seen):
            best = max(best, table.min(r, seen[pos]))
        result[i] = best
        seen.insert(pos, r)
    return result


def trace_stats(requests: Sequence[Request]) -> TraceStats:
    """Counts, arrival span and both prefix-sharing shares of a request set."""
    n = len(requests)
    if n == 0:
        return TraceStats(0, 0, 0.0, 0, 0, 0.0, 0, 0.0, 0, 0.0)
    prompts = [r.prompt for r in requests]
    lengths = np.array([p.size for p in prompts], dtype=np.int64)
    arrivals = np.array([r.arrival_time for r in requests], dtype=np.float64)
    total = int(lengths.sum())
    shared = int(shared_prefix_lengths(prompts).sum())
    cacheable = int(cacheable_prefix_lengths(prompts, np.argsort(arrivals, kind="stable")).sum())
    return TraceStats(
        num_requests=n,
        prompt_tokens_total=total,
        prompt_tokens_mean=total / n,
        prompt_tokens_max=int(lengths.max()),
        output_tokens_total=sum(r.output_len for r in requests),
        arrival_span_s=float(arrivals.max() - arrivals.min()),
        shared_prefix_tokens=shared,
        shared_prefix_share=shared / total if total else 0.0,
        cacheable_prefix_tokens=cacheable,
        cacheable_prefix_share=cacheable / total if total else 0.0,
    )


def render_stats(stats: TraceStats, title: str = "Workload statistics") -> Table:
    """A two-column rich table of the stats, for the CLI."""
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("requests", f"{stats.num_requests:,}"),
        ("prompt tokens (total)", f"{stats.prompt_tokens_total:,}"),
        ("prompt tokens (mean)", f"{stats.prompt_tokens_mean:,.1f}"),
        ("prompt tokens (max)", f"{stats.prompt_tokens_max:,}"),
        ("output tokens (total)", f"{stats.output_tokens_total:,}"),
        ("arrival span (s)", f"{stats.arrival_span_s:,.3f}"),
        (
            "shared prefix (with any other)",
            f"{stats.shared_prefix_share:.1%} ({stats.shared_prefix_tokens:,} tokens)",
        ),
        (
            "cacheable prefix (with an earlier one)",
            f"{stats.cacheable_prefix_share:.1%} ({stats.cacheable_prefix_tokens:,} tokens)",
        ),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
