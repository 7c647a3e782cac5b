"""Multi-turn chat: each turn's prompt extends the previous turn's prompt and answer.

Turn k re-sends the whole conversation so far (turn k-1's prompt, the answer
to it, and a new user message), so its cacheable prefix is everything but the
new message, and it cannot start before turn k-1 has finished. Sharing here is
across time within one conversation, not across concurrent requests, which
stresses cache retention rather than batch homogeneity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from feather_lab.workloads.arrivals import require_number
from feather_lab.workloads.base import (
    Draft,
    GeneratorConfig,
    assemble,
    random_tokens,
    seed_streams,
)
from feather_sched.request import Request

__all__ = ["MultiTurnWorkload"]


@dataclass(frozen=True)
class MultiTurnWorkload(GeneratorConfig):
    """`num_conversations` chats of `turns` turns each.

    Turn 0's prompt is `first_turn_len` random tokens; turn k's prompt is turn
    k-1's prompt + turn k-1's answer (`output_len` random tokens standing in for
    the model's reply) + `turn_len` new user tokens. Conversation start times
    come from `arrival`; turn k arrives at start + k * think_time_s. That is
    open-loop: the generator cannot know when turn k-1 will finish, so
    meta["depends_on"] names the previous turn's request id for a simulator
    that wants to hold turn k back until then. Request ids are "mt-NNNNNN",
    `group` is "conv-C"; meta also holds "conversation" and "turn".
    """

    num_conversations: int = 32
    turns: int = 6
    first_turn_len: int = 512
    turn_len: int = 128
    """New user tokens per turn after the first (the rest of its prompt is the history)."""
    output_len: int = 128
    think_time_s: float = 1.0
    """Seconds between a conversation's turn arrivals (open loop; see the class doc)."""

    MINIMUMS: ClassVar[dict[str, int | str]] = {
        **GeneratorConfig.MINIMUMS,
        "turns": 1,
        "first_turn_len": 1,
    }

    def check_shape(self, owner: str) -> None:
        """Think time is a float, so the integer checks do not cover it."""
        require_number(f"{owner}.think_time_s", self.think_time_s)

    def generate(self, seed: int) -> list[Request]:
        streams = seed_streams(seed)
        starts = self.arrival.times(self.num_conversations, streams.arrival)
        drafts: list[Draft] = []
        times: list[float] = []
        for c in range(self.num_conversations):
            prompt = random_tokens(streams.content, self.first_turn_len, self.vocab_size)
            answer = prompt[:0]  # no answer before the first turn
            for k in range(self.turns):
                if k > 0:
                    user = random_tokens(streams.content, self.turn_len, self.vocab_size)
                    prompt = np.concatenate([prompt, answer, user])
                answer = random_tokens(streams.content, self.output_len, self.vocab_size)
                drafts.append(
                    Draft(
                        prompt=prompt,
                        output_len=self.output_len,
                        group=f"conv-{c}",
                        meta={"conversation": c, "turn": k},
                    )
                )
                times.append(float(starts[c]) + k * float(self.think_time_s))
        times_arr = np.asarray(times, dtype=np.float64)
        requests = assemble("mt", drafts, times_arr, self.ignore_eos)
        ids = {(r.meta["conversation"], r.meta["turn"]): r.request_id for r in requests}
        for r in requests:
            c, k = r.meta["conversation"], r.meta["turn"]
            r.meta["depends_on"] = ids[(c, k - 1)] if k > 0 else None
        return requests
