"""A random-weight decoder of a model profile's shapes, and its decode step.

A Llama layer's matrix products and paged attention (rotary embedding and biases left out),
each layer with its own weights, so each step streams all of them as a real step does. Layers
cycle over `kv_pools` physical KV caches (as many as memory allows): between two layers that
share a pool, a layer's weights stream through the last-level cache, so the pool's blocks are
cold again, as distinct per-layer caches would be.
"""

from __future__ import annotations

from dataclasses import dataclass

from feather_sched.cost import ModelProfile


@dataclass
class Batch:
    """A composition's layout on the device."""

    tokens: object
    block_tables: object
    context_lens: object
    slots: object
    max_context: int


class RandomDecoder:
    def __init__(
        self,
        model: ModelProfile,
        device: str,
        dtype,
        kv_blocks: int,
        kv_pools: int,
        block_size: int = 16,
        seed: int = 0,
    ) -> None:
        import torch

        self.model = model
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        gen = torch.Generator(device=device).manual_seed(seed)
        h, qd, kvd, inter = model.hidden_size, model.q_dim, model.kv_dim, model.intermediate_size

        def w(*shape, std: float = 0.02):
            return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, std, generator=gen)

        self.layers = [
            {
                "n1": torch.ones(h, device=device, dtype=dtype),
                "qkv": w(h, qd + 2 * kvd),
                "o": w(qd, h),
                "n2": torch.ones(h, device=device, dtype=dtype),
                "gate_up": w(h, 2 * inter),
                "down": w(inter, h),
            }
            for _ in range(model.num_layers)
        ]
        self.embed = w(model.vocab_size, h)
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.lm_head = self.embed.t() if model.tie_word_embeddings else w(h, model.vocab_size)
        shape = (kv_blocks, block_size, model.num_kv_heads, model.head_dim)
        self.pools = [(w(*shape, std=1.0), w(*shape, std=1.0)) for _ in range(kv_pools)]
        self.scale = model.head_dim**-0.5

    @property
    def kv_blocks(self) -> int:
        return self.pools[0][0].shape[0]

    def batch(self, layout, seed: int = 0) -> Batch:
        import torch

        if layout.num_blocks > self.kv_blocks:
            raise ValueError(f"{layout.composition.label} needs {layout.num_blocks} KV blocks")
        dev = self.device
        g = torch.Generator().manual_seed(seed)
        return Batch(
            tokens=torch.randint(
                0, self.model.vocab_size, (layout.composition.batch,), generator=g
            ).to(dev),
            block_tables=torch.from_numpy(layout.block_tables).to(dev),
            context_lens=torch.from_numpy(layout.context_lens).to(dev),
            slots=torch.from_numpy(layout.slots).to(dev),
            max_context=int(layout.context_lens.max()),
        )

    def attention_only(self, b: Batch, attn, q) -> None:
        """Every layer's attention alone (the step without its matrix products)."""
        for layer in range(self.model.num_layers):
            kc, vc = self.pools[layer % len(self.pools)]
            attn(q, kc, vc, b.block_tables, b.context_lens, self.scale, max_context=b.max_context)

    def step(self, b: Batch, attn):
        import torch.nn.functional as F

        m = self.model
        n = b.tokens.shape[0]
        x = self.embed[b.tokens]
        eps = 1e-5
        for i, p in enumerate(self.layers):
            kc, vc = self.pools[i % len(self.pools)]
            h = F.rms_norm(x, (m.hidden_size,), p["n1"], eps)
            qkv = h @ p["qkv"]
            q, k, v = qkv.split((m.q_dim, m.kv_dim, m.kv_dim), dim=-1)
            kc.view(-1, m.num_kv_heads, m.head_dim).index_copy_(
                0, b.slots, k.reshape(n, m.num_kv_heads, m.head_dim)
            )
            vc.view(-1, m.num_kv_heads, m.head_dim).index_copy_(
                0, b.slots, v.reshape(n, m.num_kv_heads, m.head_dim)
            )
            a = attn(
                q.reshape(n, m.num_heads, m.head_dim),
                kc,
                vc,
                b.block_tables,
                b.context_lens,
                self.scale,
                max_context=b.max_context,
            )
            x = x + a.reshape(n, m.q_dim) @ p["o"]
            h = F.rms_norm(x, (m.hidden_size,), p["n2"], eps)
            gate, up = (h @ p["gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ p["down"]
        return F.rms_norm(x, (m.hidden_size,), self.norm, eps) @ self.lm_head

    def query(self, b: Batch):
        """A query tensor of the step's shape (for attention-only timing)."""
        import torch

        m = self.model
        return torch.randn(
            b.tokens.shape[0], m.num_heads, m.head_dim, device=self.device, dtype=self.dtype
        )
