"""A plain paged decode attention kernel in Triton.

vLLM's plain paged access pattern: one program per (request, KV head, split of
PARTITION_TOKENS), walking its blocks through the block table. Nothing is deduplicated across
requests: a shared prefix block is read by every program that needs it, and only the GPU's L2
turns the repeats into hits (the effect the probe measures). A GQA group's query heads go
together, padded to 16 rows for `tl.dot`; online softmax per split, splits merged in torch.
Runs under TRITON_INTERPRET=1 on CPU tensors (the CI test against the reference).
"""

from __future__ import annotations

import triton
import triton.language as tl

PARTITION_TOKENS = 512


@triton.jit
def _paged_decode_kernel(
    Q,
    K,
    V,
    BT,
    LENS,
    Out,
    M,
    Lse,
    scale,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_os,
    stride_mb,
    stride_mh,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PARTITION_BLOCKS: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    n = tl.load(LENS + seq)
    first_block = split * PARTITION_BLOCKS
    blocks_here = tl.minimum(PARTITION_BLOCKS, tl.cdiv(n, BLOCK_SIZE) - first_block)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    t = tl.arange(0, BLOCK_SIZE)
    gmask = g < GROUP
    heads = kvh * GROUP + g
    q = tl.load(
        Q + seq * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=gmask[:, None],
        other=0.0,
    )
    q = q.to(tl.float32) * scale

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for j in range(0, blocks_here):
        blk = first_block + j
        phys = tl.load(BT + seq * stride_bt + blk).to(tl.int64)
        pos = blk * BLOCK_SIZE + t
        valid = pos < n
        k = tl.load(
            K + phys * stride_kb + t[:, None] * stride_ks + kvh * stride_kh + d[None, :],
            mask=valid[:, None],
            other=0.0,
        )
        s = tl.dot(q.to(k.dtype), tl.trans(k), out_dtype=tl.float32)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            V + phys * stride_vb + t[:, None] * stride_vs + kvh * stride_vh + d[None, :],
            mask=valid[:, None],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, out_dtype=tl.float32)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    o_ptr = Out + seq * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :]
    tl.store(o_ptr, out, mask=gmask[:, None])
    ml_off = seq * stride_mb + heads * stride_mh + split
    tl.store(M + ml_off, m_i, mask=gmask)
    tl.store(Lse + ml_off, l_i, mask=gmask)


def triton_paged_decode(
    q, k_cache, v_cache, block_tables, context_lens, scale: float, *, max_context: int | None = None
):
    """Paged decode attention (see `attention` for the signature). `max_context` (the longest
    context in the batch) sets the number of splits; pass it to avoid a device sync."""
    import torch

    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    if max_context is None:
        max_context = int(context_lens.max())
    part_blocks = max(1, PARTITION_TOKENS // block_size)
    splits = max(1, triton.cdiv(triton.cdiv(max_context, block_size), part_blocks))
    o = torch.empty((batch, num_heads, splits, head_dim), device=q.device, dtype=torch.float32)
    m = torch.empty((batch, num_heads, splits), device=q.device, dtype=torch.float32)
    lse = torch.empty_like(m)
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1 and q.stride(2) == 1
    _paged_decode_kernel[(batch, num_kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        o,
        m,
        lse,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        o.stride(0),
        o.stride(1),
        o.stride(2),
        m.stride(0),
        m.stride(1),
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        PARTITION_BLOCKS=part_blocks,
    )
    if splits == 1:
        return o[:, :, 0].to(q.dtype)
    w = torch.exp(m - m.amax(dim=-1, keepdim=True)) * lse  # empty splits: exp(-inf) * 0 = 0
    out = (o * w.unsqueeze(-1)).sum(dim=2) / w.sum(dim=-1, keepdim=True)
    return out.to(q.dtype)
