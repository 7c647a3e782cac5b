"""Paged decode attention: the torch reference (CPU path and tests' oracle) and the kernel
registry.

Every kernel has the signature of vLLM's paged decode attention:

    attn(q, k_cache, v_cache, block_tables, context_lens, scale) -> out

- q: [batch, num_heads, head_dim], one query token per request;
- k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim] (vLLM's layout);
- block_tables: [batch, max_blocks] int32 physical block ids; context_lens: [batch] int32;
- out: [batch, num_heads, head_dim] in q's dtype. Grouped-query attention: query head h reads
  KV head h // (num_heads // num_kv_heads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

AttentionFn = Callable[..., Any]


def reference_paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale: float, **_):
    """One request at a time, in batch order, each gathering its own blocks through its block
    table (the plain paged access pattern: a shared block is read once per request that holds
    it, as a CPU attention loop reads it). Float32 softmax."""
    import torch

    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    lens = context_lens.tolist()
    # One gather buffer reused by every request: fresh large allocations would be new pages
    # (page faults, zeroing) on every request, and would push the shared blocks out of cache.
    kbuf = torch.empty(
        (block_tables.shape[1], *k_cache.shape[1:]), dtype=k_cache.dtype, device=k_cache.device
    )
    vbuf = torch.empty_like(kbuf)
    for i in range(batch):
        n = int(lens[i])
        nb = -(-n // block_size)
        blocks = block_tables[i, :nb].long()
        k = torch.index_select(k_cache, 0, blocks, out=kbuf[:nb])
        v = torch.index_select(v_cache, 0, blocks, out=vbuf[:nb])
        k = k.reshape(nb * block_size, num_kv_heads, head_dim)[:n].float()
        v = v.reshape(nb * block_size, num_kv_heads, head_dim)[:n].float()
        qi = q[i].view(num_kv_heads, group, head_dim).float()
        s = torch.einsum("hgd,nhd->hgn", qi, k) * scale
        p = torch.softmax(s, dim=-1)
        out[i] = torch.einsum("hgn,nhd->hgd", p, v).reshape(num_heads, head_dim).to(q.dtype)
    return out


KERNELS = ("torch-ref", "triton-paged", "flashinfer")


def kernels(device: str, names: list[str] | None = None) -> dict[str, AttentionFn]:
    """The attention kernels to time, the first one fitted. Default: cpu -> the reference;
    cuda -> the Triton kernel, then FlashInfer when importable. `names` picks others: the
    Triton kernel also runs on a CPU under TRITON_INTERPRET=1 (a dry run of the GPU path)."""
    if names is None:
        names = ["torch-ref"] if device == "cpu" else ["triton-paged", "flashinfer"]
        optional = {"flashinfer"}
    else:
        optional = set()
    out: dict[str, AttentionFn] = {}
    for name in names:
        if name == "torch-ref":
            out[name] = reference_paged_decode
        elif name == "triton-paged":
            from feather_lab.probe.triton_decode import triton_paged_decode

            out[name] = triton_paged_decode
        elif name == "flashinfer":
            from feather_lab.probe.flashinfer_decode import (
                flashinfer_available,
                flashinfer_paged_decode,
            )

            if device == "cuda" and flashinfer_available():
                out[name] = flashinfer_paged_decode
            elif name not in optional:
                raise ValueError("flashinfer needs --device cuda and an importable flashinfer")
        else:
            raise ValueError(f"unknown kernel {name!r}; kernels: {', '.join(KERNELS)}")
    return out
