"""The prefix cache's keys: chained digests of a prompt's full KV blocks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

_xxh3 = xxhash.xxh3_64_intdigest
_ROOT = bytes(8)  # parent digest bytes for the first block (an all-zero 64-bit digest)


def block_hashes(prompt: np.ndarray | Sequence[int], block_size: int = 16) -> list[int]:
    """Chained 64-bit digests of the FULL ``block_size``-token blocks of ``prompt``.

    ``digest_i = xxh3_64(digest_{i-1}.to_bytes(8, "little") + block_i_int32_le_bytes)``
    with ``digest_{-1} = 0``, so equal digests mean (up to a 2**-64 collision chance) an
    equal prefix through that block. A trailing partial block gets no digest. Tokens are
    hashed as little-endian int32, so the result is platform independent.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    arr = np.ascontiguousarray(prompt, dtype="<i4")
    if arr.ndim != 1:
        raise ValueError(f"prompt must be 1-D, got shape {arr.shape}")
    data = arr.tobytes()
    step = 4 * block_size
    n_full = len(arr) // block_size
    out: list[int] = []
    prev = _ROOT
    for i in range(n_full):
        d = _xxh3(prev + data[i * step : (i + 1) * step])
        out.append(d)
        prev = d.to_bytes(8, "little")
    return out
