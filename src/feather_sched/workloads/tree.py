"""Tree-shaped prompts with parallel sampling: sharing at several depths at once.

Agent scaffolds, few-shot variants and tree-of-thought searches extend one root
prompt along branches; parallel sampling (n > 1) then asks for several
completions of the same leaf prompt. Siblings share the root plus the path to
their parent, and samples of one leaf share everything, so a scheduler that
only knows "same prefix or not" sees several nested group sizes.
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

__all__ = ["TreeWorkload"]

MAX_LEAVES = 1_000_000


@dataclass(frozen=True)
class TreeWorkload:
    """`num_trees` trees: a root of `root_len` tokens, `branching` children per node.

    Each of the `depth` levels adds a fresh random segment of `branch_len` tokens
    per node, so a leaf's prompt is root + one segment per level
    (root_len + depth * branch_len tokens), and every leaf is requested
    `samples_per_leaf` times with the identical prompt. Request ids are
    "tr-NNNNNN", `group` is "tree-T"; meta holds "tree", "path" (child index per
    level) and "sample".
    """

    num_trees: int = 8
    root_len: int = 1024
    branching: int = 4
    depth: int = 2
    branch_len: int = 256
    samples_per_leaf: int = 4
    output_len: int = 128
    vocab_size: int = 32000
    arrival: ArrivalProcess = field(default_factory=AllAtOnce)
    shuffle: bool = True

    def __post_init__(self) -> None:
        owner = type(self).__name__
        require_int(owner, "num_trees", self.num_trees, 0)
        require_int(owner, "root_len", self.root_len, 0)
        require_int(owner, "branching", self.branching, 1)
        require_int(owner, "depth", self.depth, 0)
        require_int(owner, "branch_len", self.branch_len, 0)
        require_int(owner, "samples_per_leaf", self.samples_per_leaf, 0)
        require_int(owner, "output_len", self.output_len, 1)
        require_vocab(owner, self.vocab_size)
        if self.root_len + self.depth * self.branch_len < 1:
            raise ValueError(f"{owner}: root_len + depth * branch_len must be >= 1")
        leaves = self.branching**self.depth
        if leaves > MAX_LEAVES:
            raise ValueError(
                f"{owner}: branching**depth = {leaves} leaves per tree is over {MAX_LEAVES}"
            )
        coerce_arrival(self, self.arrival)

    def _leaves(self, rng: np.random.Generator) -> list[tuple[tuple[int, ...], np.ndarray]]:
        """Expand one tree breadth-first; returns (path, prompt) per leaf in path order."""
        level: list[tuple[tuple[int, ...], np.ndarray]] = [
            ((), random_tokens(rng, self.root_len, self.vocab_size))
        ]
        for _ in range(self.depth):
            segments = random_tokens(
                rng, (len(level), self.branching, self.branch_len), self.vocab_size
            )
            level = [
                ((*path, b), np.concatenate([prompt, segments[i, b]]))
                for i, (path, prompt) in enumerate(level)
                for b in range(self.branching)
            ]
        return level

    def generate(self, seed: int) -> list[Request]:
        streams = seed_streams(seed)
        drafts: list[Draft] = []
        for t in range(self.num_trees):
            for path, prompt in self._leaves(streams.content):
                drafts.extend(
                    Draft(
                        prompt=prompt.copy(),  # no aliasing between samples
                        output_len=self.output_len,
                        group=f"tree-{t}",
                        meta={"tree": t, "path": list(path), "sample": s},
                    )
                    for s in range(self.samples_per_leaf)
                )
        return finish("tr", drafts, self.arrival, streams, shuffle=self.shuffle)
