"""Model profiles: the architecture of a Llama-style decoder, and the sizes derived from it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from feather_sched.cost.profile_schema import (
    Checks,
    ProfileError,
    ProfileIO,
    boolean,
    non_negative_int,
    positive,
    positive_int,
    text,
)


@dataclass(frozen=True)
class ModelProfile(ProfileIO):
    """Architecture of a Llama-style decoder (RMSNorm, GQA attention, SwiGLU MLP).

    ``dtype_bytes`` is the weight element size; ``kv_dtype_bytes`` the KV-cache
    element size (defaults to ``dtype_bytes``; set 1 for an fp8 KV cache).

    Derived quantities (properties):

    - ``num_params``: all parameters, embedding and (untied) LM head included.
    - ``weight_bytes``: ``num_params * dtype_bytes`` (storage).
    - ``weight_bytes_per_step``: bytes of weights one forward pass streams. An untied
      input-embedding table is only gathered for the step's tokens, so it is left
      out; a tied table is read in full by the LM head, so it stays in.
    - ``flops_per_token``: ``2 * matmul_params``: every linear layer including the
      LM head, excluding the embedding lookup, norms and biases. The LM head is
      charged to every token (engines only compute logits for sampled positions, so
      this overcounts chunked prefill by ``vocab*hidden/matmul_params``, ~7% for
      Llama-3-8B; negligible next to the error of the efficiency factors).
    - ``attn_flops_per_pair``: FLOPs of one (query token, context token) pair summed
      over layers: QK^T and PV are each ``2 * num_heads * head_dim`` FLOPs.
    - ``kv_bytes_per_token_per_layer`` = ``2 * num_kv_heads * head_dim * kv_dtype_bytes``
      and ``kv_bytes_per_token`` = that times ``num_layers``.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: float
    kv_dtype_bytes: float | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_context_tokens: int = 0
    """Longest sequence (prompt + output) the model serves; 0 = unknown, not checked."""
    hf_repo: str = ""
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    _KIND: ClassVar[str] = "model"
    _CHECKS: ClassVar[Checks] = {
        "num_layers": positive_int,
        "hidden_size": positive_int,
        "num_heads": positive_int,
        "num_kv_heads": positive_int,
        "head_dim": positive_int,
        "intermediate_size": positive_int,
        "vocab_size": positive_int,
        "dtype_bytes": positive,
        "kv_dtype_bytes": lambda v: None if v is None else positive(v),
        "tie_word_embeddings": boolean,
        "attention_bias": boolean,
        "max_context_tokens": non_negative_int,
        "hf_repo": text,
        "description": text,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_heads % self.num_kv_heads:
            raise ProfileError(
                f"model profile {self.name!r}: field 'num_kv_heads' must divide num_heads "
                f"({self.num_heads}), got {self.num_kv_heads}"
            )

    # -- parameter counts
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the q, k, v, o projections and the gate/up/down MLP matrices."""
        h = self.hidden_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        mlp = 3 * h * self.intermediate_size
        return attn + mlp

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        bias = (self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0
        norms = 2 * self.hidden_size
        per_layer = self.linear_params_per_layer + bias + norms
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.num_layers * per_layer + self.hidden_size + self.embedding_params + lm_head

    @property
    def matmul_params(self) -> int:
        """Parameters that take part in a GEMM per token (all linears + LM head)."""
        return self.num_layers * self.linear_params_per_layer + self.embedding_params

    # -- bytes and flops
    @property
    def kv_element_bytes(self) -> float:
        return self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes

    @property
    def weight_bytes_per_step(self) -> float:
        gathered_only = 0 if self.tie_word_embeddings else self.embedding_params
        return (self.num_params - gathered_only) * self.dtype_bytes

    @property
    def kv_bytes_per_token_per_layer(self) -> float:
        return 2 * self.kv_dim * self.kv_element_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return self.num_layers * self.kv_bytes_per_token_per_layer

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.matmul_params

    @property
    def attn_flops_per_pair(self) -> float:
        return 4.0 * self.num_layers * self.q_dim
