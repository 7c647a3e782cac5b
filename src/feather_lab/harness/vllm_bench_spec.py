"""What `feather vllm-bench` runs, and the request stream both engines are fed.

Shared-prefix shape: each request is one of `groups` system prompts plus a private question,
with short outputs, so requests finish and new ones are admitted on every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from feather_lab.harness.vllm_spec import BLOCK_SIZE, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS

PROMPT_RANGE = (256, 1536)
"""Tokens of a group's system prompt (uniform)."""
QUESTION_RANGE = (64, 512)
"""Tokens of a request's private question (uniform)."""


@dataclass(frozen=True)
class VllmPassSpec:
    """What `feather vllm-bench` runs."""

    sizes: Sequence[int] = (1000, 10000)
    """Waiting-queue lengths, held at each for the whole run."""
    repeats: int = 5
    steps: int = 40
    """Timed engine steps per run."""
    warmup: int = 8
    """Engine steps before timing (the running batch fills)."""
    policy: str = "feather"
    """Feather's policy (`FEATHER_POLICY` of a deployment; the vLLM default is feather)."""
    groups: int = 64
    """Distinct system prompts."""
    output_len: int = 8
    kv_blocks: int = 1024
    block_size: int = BLOCK_SIZE
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    seed: int = 0

    def validate(self) -> None:
        """A clear error before any engine starts."""
        from feather_sched.policies.registry import policy_names

        if self.policy not in policy_names():
            raise ValueError(
                f"--policy {self.policy!r} is not a policy; valid: {', '.join(policy_names())}"
            )
        if not self.sizes:
            raise ValueError("--sizes names no queue length")
        positive = ("repeats", "steps", "groups", "output_len", "kv_blocks", "block_size",
                    "max_num_seqs", "max_num_batched_tokens")  # fmt: skip
        for name in positive:
            if getattr(self, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0 or min(self.sizes) < 1:
            raise ValueError(
                f"--warmup must be >= 0 and --sizes >= 1, got {self.warmup}, {list(self.sizes)}"
            )
        if self.kv_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"--kv-blocks {self.kv_blocks} x {self.block_size} tokens cannot hold one "
                f"request of up to {self.max_model_len} tokens"
            )

    @property
    def max_model_len(self) -> int:
        """The longest request: the longest system prompt and question, and its output."""
        return PROMPT_RANGE[1] + QUESTION_RANGE[1] + self.output_len


class RequestStream:
    """The same requests, in the same order, for every engine: `take(k)` the next k prompts
    (ids >= 4: 0-3 are the tokenizer's specials). A fresh stream per run and engine."""

    def __init__(self, spec: VllmPassSpec, vocab: int, tag: str) -> None:
        rng = np.random.default_rng(spec.seed)
        lo, hi = PROMPT_RANGE
        self.prompts = [
            rng.integers(4, vocab, int(rng.integers(lo, hi + 1))).tolist()
            for _ in range(spec.groups)
        ]
        self.rng = np.random.default_rng(spec.seed + 1)
        self.vocab = vocab
        self.tag = tag
        self.issued = 0

    def take(self, k: int) -> list[tuple[str, list[int]]]:
        """The next k requests: (request id, prompt token ids)."""
        out = []
        lo, hi = QUESTION_RANGE
        for _ in range(k):
            group = int(self.rng.integers(len(self.prompts)))
            question = self.rng.integers(4, self.vocab, int(self.rng.integers(lo, hi + 1)))
            out.append((f"{self.tag}{self.issued}", self.prompts[group] + question.tolist()))
            self.issued += 1
        return out
