"""FlashInfer's batch decode over the same paged cache: a second kernel, only when FlashInfer
is importable (it is not on this project's machines so far: this wrapper is untested on a
GPU). It reads the same vLLM layout (NHD pages = blocks), planned once per composition, and is
timed without CUDA graphs (its wrapper needs a graph-specific mode for capture)."""

from __future__ import annotations

import importlib.util


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


class FlashInferDecode:
    """`plan(block_tables, context_lens, ...)` once per batch, then call like the others."""

    needs_plan = True
    graph_safe = False

    def __init__(self) -> None:
        self._wrapper = None

    def plan(self, q, k_cache, block_tables, context_lens, scale: float) -> None:
        import flashinfer
        import torch

        if self._wrapper is None:
            ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=q.device)
            self._wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        block_size = k_cache.shape[1]
        lens = context_lens.long()
        pages = (lens + block_size - 1) // block_size
        indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device=q.device)
        indptr[1:] = torch.cumsum(pages, 0)
        cols = torch.arange(block_tables.shape[1], device=q.device)
        indices = block_tables[cols[None, :] < pages[:, None]].int()
        last = (lens - (pages - 1) * block_size).int()
        self._wrapper.plan(
            indptr,
            indices,
            last,
            q.shape[1],
            k_cache.shape[2],
            q.shape[2],
            block_size,
            pos_encoding_mode="NONE",
            q_data_type=q.dtype,
            kv_data_type=k_cache.dtype,
            sm_scale=scale,
        )

    def __call__(self, q, k_cache, v_cache, block_tables, context_lens, scale, **_):
        assert self._wrapper is not None, "plan() first"
        return self._wrapper.run(q, (k_cache, v_cache))


flashinfer_paged_decode = FlashInferDecode()
