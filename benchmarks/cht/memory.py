"""CHT memory at long-context scale: 100,000 waiting requests of 32,000 tokens.

The index's memory depends only on the digest chains, so the chains are made directly
(random uint64 digests; no 12.8 GB of token arrays, no hashing): `--groups` prefix groups
sharing the first `--shared` of each prompt (0: no two prompts share anything), the rest
private. Memory = what building the index allocates (tracemalloc), per request and in all,
beside the raw digests (8 bytes a chunk). `--flat-sample` requests are also put in the flat
index this repository used before (tests/flat_cht_reference.py), whose cost is linear in the
queue, to extrapolate it to the same queue.

    PYTHONPATH=src python benchmarks/cht/memory.py OUT.json
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path

import numpy as np

from feather_lab.bench.record import write_record
from feather_sched.index.cht import ChunkedHashTree


def chains(n: int, chunks: int, groups: int, shared: float, seed: int = 0):
    """`n` digest chains of `chunks` levels; group g = i % groups shares its first
    `shared * chunks` levels."""
    rng = np.random.default_rng(seed)
    head = int(chunks * shared) if groups else 0
    prefixes = rng.integers(0, 2**63, (max(groups, 1), head), dtype=np.uint64)
    for i in range(n):
        tail = rng.integers(0, 2**63, chunks - head, dtype=np.uint64)
        yield f"q{i}", np.concatenate([prefixes[i % max(groups, 1)], tail])


def measure(cls, n: int, chunks: int, groups: int, shared: float) -> float:
    """Bytes the index allocates for `n` waiting requests (the chains are made before)."""
    data = list(chains(n, chunks, groups, shared))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = cls(16)
        for rid, d in data:
            index.add(rid, digests=d if cls is ChunkedHashTree else d.tolist())
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del index, data
    gc.collect()
    return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=32_000)
    parser.add_argument("--chunk-sizes", default="16,64")
    parser.add_argument("--flat-sample", type=int, default=500)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from flat_cht_reference import ChunkedHashTree as FlatCHT

    rows = []
    for chunk in (int(c) for c in args.chunk_sizes.split(",")):
        chunks = -(-args.tokens // chunk)
        for label, groups, shared in (
            ("100 groups, 75% shared", 100, 0.75),
            ("no sharing", 0, 0.0),
        ):
            used = measure(ChunkedHashTree, args.requests, chunks, groups, shared)
            flat = measure(FlatCHT, args.flat_sample, chunks, groups, shared)
            row = {
                "chunk_size": chunk,
                "requests": args.requests,
                "prompt_tokens": args.tokens,
                "sharing": label,
                "chunks_per_request": chunks,
                "digest_bytes_per_request": 8 * chunks,
                "bytes_per_request": round(used / args.requests, 1),
                "total_gib": round(used / 2**30, 3),
                "flat_bytes_per_request": round(flat / args.flat_sample, 1),
                "flat_total_gib_extrapolated": round(
                    flat / args.flat_sample * args.requests / 2**30, 1
                ),
            }
            print(row, flush=True)
            rows.append(row)
    write_record(args.out, rows=rows)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
