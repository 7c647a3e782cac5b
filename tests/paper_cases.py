"""Hand-made cases for the authors' two policies: prompts built from named 50-token chunks, and
a host that drives one admission pass the way every Feather host does (candidate, ADD/STOP,
admit), over a real CHT."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from feather_sched.index.cht import ChunkedHashTree
from feather_sched.policies.base import Policy
from feather_sched.request import Request

CHUNK = 50


def prompt(chunks: str, tail: int = 0) -> np.ndarray:
    """One 50-token chunk per letter (same letter, same tokens), then `tail` extra tokens."""
    blocks = [np.full(CHUNK, 1000 + ord(c), dtype=np.int32) for c in chunks]
    blocks.append(np.arange(tail, dtype=np.int32) + 7)
    return np.concatenate(blocks)


class PaperHost:
    """The parts of a SchedulerView the authors' policies read, over a real CHT (64-token
    chunks: the policies must not read them), and the host's side of a pass."""

    block_size = 16
    max_num_seqs = 256
    now = 0.0

    def __init__(self) -> None:
        self.index = ChunkedHashTree(64)
        self._requests: dict[str, Request] = {}

    # SchedulerView
    @property
    def num_running(self) -> int:
        return self.index.num_running

    def waiting_ids(self) -> Iterator[str]:
        return self.index.waiting_ids()

    def request(self, request_id: str) -> Request:
        return self._requests[request_id]

    # the host
    def arrive(self, rid: str, tokens: np.ndarray) -> None:
        self._requests[rid] = Request(rid, tokens, output_len=4)
        self.index.add(rid, tokens)

    def run(self, rid: str, tokens: np.ndarray) -> None:
        """A request already running when the case starts."""
        self.arrive(rid, tokens)
        self.index.admit(rid)

    def step(self, policy: Policy, step_time: float | None = None) -> list[tuple[str, bool]]:
        """One admission pass: (candidate, ADD?) until a STOP or no candidate; then, with a
        step time, the step's feedback."""
        policy.begin_step(self)
        asked = []
        gen = policy.candidates(self)
        for rid in gen:
            add = policy.accept(self, rid)
            asked.append((rid, add))
            if not add:
                break
            self.index.admit(rid)
        gen.close()
        if step_time is not None:
            policy.end_step(self, step_time, self.num_running)
        return asked
