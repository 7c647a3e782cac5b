"""Few very long shared prefixes with short suffixes: the paper's headline case.

The paper's setting is one (or a few) prefixes of 5,000-10,000 tokens, many
requests per prefix, a ~20-token suffix and short outputs. Decode then reads
mostly prefix KV, which is exactly where batch homogeneity pays.
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

__all__ = ["LongPrefixWorkload"]


@dataclass(frozen=True)
class LongPrefixWorkload:
    """`num_prefixes` long prefixes, `requests_per_prefix` short suffixes behind each.

    Prefix length is `prefix_len`, or, when `prefix_len_max` is set, drawn per
    prefix uniformly from [prefix_len, prefix_len_max] (the paper: 5000-10000).
    Request ids are "lp-NNNNNN", `group` is "prefix-G", meta["prefix_len"] the
    group's prefix length.
    """

    num_prefixes: int = 1
    prefix_len: int = 10000
    prefix_len_max: int | None = None
    requests_per_prefix: int = 200
    suffix_len: int = 20
    output_len: int = 50
    vocab_size: int = 32000
    arrival: ArrivalProcess = field(default_factory=AllAtOnce)
    shuffle: bool = True

    def __post_init__(self) -> None:
        owner = type(self).__name__
        require_int(owner, "num_prefixes", self.num_prefixes, 0)
        require_int(owner, "prefix_len", self.prefix_len, 0)
        if self.prefix_len_max is not None:
            require_int(owner, "prefix_len_max", self.prefix_len_max, self.prefix_len)
        require_int(owner, "requests_per_prefix", self.requests_per_prefix, 0)
        require_int(owner, "suffix_len", self.suffix_len, 0)
        require_int(owner, "output_len", self.output_len, 1)
        require_vocab(owner, self.vocab_size)
        if self.prefix_len + self.suffix_len < 1:
            raise ValueError(f"{owner}: prefix_len + suffix_len must be >= 1")
        coerce_arrival(self, self.arrival)

    def generate(self, seed: int) -> list[Request]:
        streams = seed_streams(seed)
        drafts: list[Draft] = []
        for g in range(self.num_prefixes):
            length = self.prefix_len
            if self.prefix_len_max is not None:
                length = int(streams.content.integers(self.prefix_len, self.prefix_len_max + 1))
            prefix = random_tokens(streams.content, length, self.vocab_size)
            suffixes = random_tokens(
                streams.content, (self.requests_per_prefix, self.suffix_len), self.vocab_size
            )
            drafts.extend(
                Draft(
                    prompt=np.concatenate([prefix, s]),
                    output_len=self.output_len,
                    group=f"prefix-{g}",
                    meta={"prefix_len": length},
                )
                for s in suffixes
            )
        return finish("lp", drafts, self.arrival, streams, shuffle=self.shuffle)
