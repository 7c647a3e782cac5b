"""Groups of prompts behind one system prompt each (SGLang's generated-shared-prefix shape).

This mirrors `bench_serving.py --dataset-name generated-shared-prefix`: G groups,
each with its own system prompt, P prompts per group made of that system prompt
plus a random question, all shuffled together. It is the standard
prefix-sharing benchmark, so results here line up with published SGLang runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from feather_sched.request import Request
from feather_sched.workloads.arrivals import AllAtOnce, ArrivalProcess
from feather_sched.workloads.base import (
    Draft,
    coerce_arrival,
    finish,
    random_tokens,
    require_int,
    require_vocab,
    seed_streams,
)

__all__ = ["SharedPrefixWorkload"]


@dataclass(frozen=True)
class SharedPrefixWorkload:
    """`num_groups` system prompts, `prompts_per_group` questions behind each.

    Request ids are "sp-NNNNNN", `group` is "prefix-G" and meta["prefix_len"] is
    the system prompt length. Two prompts of one group share exactly the system
    prompt (plus, by chance, a first question token with odds 1/vocab_size).
    `shuffle=False` keeps groups contiguous, the easy case for FCFS.
    """

    num_groups: int = 64
    prompts_per_group: int = 16
    system_prompt_len: int = 2048
    question_len: int = 128
    output_len: int = 256
    vocab_size: int = 32000
    arrival: ArrivalProcess = field(default_factory=AllAtOnce)
    shuffle: bool = True

    def __post_init__(self) -> None:
        owner = type(self).__name__
        require_int(owner, "num_groups", self.num_groups, 0)
        require_int(owner, "prompts_per_group", self.prompts_per_group, 0)
        require_int(owner, "system_prompt_len", self.system_prompt_len, 0)
        require_int(owner, "question_len", self.question_len, 0)
        require_int(owner, "output_len", self.output_len, 1)
        require_vocab(owner, self.vocab_size)
        if self.system_prompt_len + self.question_len < 1:
            raise ValueError(f"{owner}: system_prompt_len + question_len must be >= 1")
        coerce_arrival(self, self.arrival)

    def generate(self, seed: int) -> list[Request]:
        streams = seed_streams(seed)
        drafts: list[Draft] = []
        for g in range(self.num_groups):
            system = random_tokens(streams.content, self.system_prompt_len, self.vocab_size)
            questions = random_tokens(
                streams.content, (self.prompts_per_group, self.question_len), self.vocab_size
            )
            drafts.extend(
                Draft(
                    prompt=np.concatenate([system, q]),
                    output_len=self.output_len,
                    group=f"prefix-{g}",
                    meta={"prefix_len": self.system_prompt_len},
                )
                for q in questions
            )
        return finish("sp", drafts, self.arrival, streams, shuffle=self.shuffle)
