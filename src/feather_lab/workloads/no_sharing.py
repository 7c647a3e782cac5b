"""Independent random prompts: the control case where prefix-aware scheduling must not lose.

Every prompt is drawn independently and uniformly, so two prompts share a
leading token only by chance (odds 1/vocab_size per pair, two tokens
1/vocab_size**2, ...): a few tokens at most, never a useful prefix. The
default prompt length (2176 = 2048 + 128) matches the shared-prefix workload's
total, so the two differ only in sharing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from feather_lab.workloads.base import Draft, GeneratorConfig, finish, random_tokens, seed_streams
from feather_sched.request import Request

__all__ = ["NoSharingWorkload"]


@dataclass(frozen=True)
class NoSharingWorkload(GeneratorConfig):
    """`num_requests` prompts of `prompt_len` independent random tokens; ids "ns-NNNNNN"."""

    num_requests: int = 1024
    prompt_len: int = 2176
    output_len: int = 256

    MINIMUMS: ClassVar[dict[str, int | str]] = {**GeneratorConfig.MINIMUMS, "prompt_len": 1}

    def generate(self, seed: int) -> list[Request]:
        streams = seed_streams(seed)
        prompts = random_tokens(
            streams.content, (self.num_requests, self.prompt_len), self.vocab_size
        )
        drafts = [Draft(prompt=p.copy(), output_len=self.output_len) for p in prompts]
        eos = self.ignore_eos
        return finish("ns", drafts, self.arrival, streams, shuffle=False, ignore_eos=eos)
