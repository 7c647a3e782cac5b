"""The prefix-group family: groups of requests behind one shared prefix each.

SGLang's shared-prefix benchmark, the paper's long-prefix case, document QA and tree-shaped
prompts are one generator with different numbers: `num_groups` groups, each a random prefix
(fixed length, or drawn per group from a range), extended by zero or more levels of branches
(`branching` children per node, each adding a fresh random segment), each leaf requested
`samples` times. A flat group (a system prompt and its questions) is one level whose branches
are the questions. `PrefixGroups` is that shape; the named workloads below are thin configs
that keep their own field names (the ones their papers and CLI overrides use) and map them onto
it, so the token stream, ids and order stay what each generated before they shared this code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from feather_lab.workloads.arrivals import ArrivalProcess
from feather_lab.workloads.base import (
    Draft,
    GeneratorConfig,
    finish,
    random_tokens,
    seed_streams,
)
from feather_sched.request import Request

__all__ = [
    "MAX_LEAVES",
    "DocumentQAWorkload",
    "LongPrefixWorkload",
    "PrefixGroupWorkload",
    "PrefixGroups",
    "SharedPrefixWorkload",
    "TreeWorkload",
]

MAX_LEAVES = 1_000_000
"""Leaves one tree may have: a guard against a typo'd depth building a huge workload."""

Leaf = tuple[tuple[int, ...], np.ndarray]
"""(child index per level, prompt) of one leaf of a group."""


@dataclass(frozen=True)
class PrefixGroups:
    """The shape of a prefix-group workload; `generate` turns it into requests.

    Per group, in this order, the content stream draws: the prefix length (only when
    `prefix_len_max` is set, uniform in [prefix_len, prefix_len_max]), the prefix tokens, then
    each level's segments for all nodes of that level at once. Requests are "{id_prefix}-N",
    grouped as "{group_label}-G". meta is {"prefix_len": L} (`meta_style="prefix_len"`) or
    {"tree": G, "path": [...], "sample": S} (`meta_style="tree"`).
    """

    id_prefix: str
    group_label: str
    num_groups: int
    prefix_len: int
    output_len: int
    vocab_size: int
    levels: tuple[tuple[int, int], ...] = ()
    """(branching, segment_len) per level below the prefix."""
    prefix_len_max: int | None = None
    samples: int = 1
    meta_style: Literal["prefix_len", "tree"] = "prefix_len"

    @property
    def min_prompt_len(self) -> int:
        """The shortest prompt this shape can produce."""
        return self.prefix_len + sum(length for _, length in self.levels)

    def generate(
        self, arrival: ArrivalProcess, shuffle: bool, seed: int, ignore_eos: bool = False
    ) -> list[Request]:
        """All groups' drafts in group order, shuffled if asked, timed and numbered."""
        streams = seed_streams(seed)
        drafts = [d for g in range(self.num_groups) for d in self._group(g, streams.content)]
        return finish(
            self.id_prefix, drafts, arrival, streams, shuffle=shuffle, ignore_eos=ignore_eos
        )

    def _group(self, g: int, rng: np.random.Generator) -> list[Draft]:
        length = self.prefix_len
        if self.prefix_len_max is not None:
            length = int(rng.integers(self.prefix_len, self.prefix_len_max + 1))
        prefix = random_tokens(rng, length, self.vocab_size)
        return [
            Draft(
                prompt=prompt.copy(),  # no aliasing between samples of one leaf
                output_len=self.output_len,
                group=f"{self.group_label}-{g}",
                meta=self._meta(g, length, path, s),
            )
            for path, prompt in self._leaves(prefix, rng)
            for s in range(self.samples)
        ]

    def _leaves(self, prefix: np.ndarray, rng: np.random.Generator) -> list[Leaf]:
        """Expand one group breadth-first; (path, prompt) per leaf in path order."""
        level: list[Leaf] = [((), prefix)]
        for branching, length in self.levels:
            segments = random_tokens(rng, (len(level), branching, length), self.vocab_size)
            level = [
                ((*path, b), np.concatenate([prompt, segments[i, b]]))
                for i, (path, prompt) in enumerate(level)
                for b in range(branching)
            ]
        return level

    def _meta(self, g: int, prefix_len: int, path: tuple[int, ...], sample: int) -> dict:
        if self.meta_style == "tree":
            return {"tree": g, "path": list(path), "sample": sample}
        return {"prefix_len": prefix_len}


@dataclass(frozen=True, kw_only=True)
class PrefixGroupWorkload(GeneratorConfig):
    """Base of the named prefix-group configs: validation plus generation through `shape()`.

    A subclass is declared as data in its class statement: `ids` and `group` name its
    requests and groups, and `level` names, for a one-level family point, its fields for
    (groups, prefix tokens, requests per group, suffix tokens[, the largest prefix: prefix
    lengths then drawn per group up to it]); a subclass without `level` writes `shape()` and
    says, as `prompt_len` in its own field names, the sum that must be at least one token (a
    one-level point's is its prefix plus its suffix). Each subclass has an `output_len` field.
    """

    ID_PREFIX: ClassVar[str]
    GROUP_LABEL: ClassVar[str]
    PROMPT_LEN: ClassVar[str]
    LEVEL: ClassVar[tuple[str, ...] | None] = None
    shuffle: bool = True
    """Shuffle the drafts before arrival times are paired (False keeps groups contiguous)."""

    def __init_subclass__(
        cls,
        *,
        ids: str,
        group: str,
        level: tuple[str, ...] | None = None,
        prompt_len: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if prompt_len is None:
            if level is None:
                raise TypeError(f"{cls.__name__}: declare `level` or `prompt_len`")
            prompt_len = f"{level[1]} + {level[3]}"
        cls.ID_PREFIX, cls.GROUP_LABEL, cls.PROMPT_LEN, cls.LEVEL = ids, group, prompt_len, level

    def shape(self) -> PrefixGroups:
        """This config as a point of the family (one level, from the fields `level` names)."""
        if self.LEVEL is None:
            raise NotImplementedError(f"{type(self).__name__} declares no level: write shape()")
        groups, prefix_len, per_group, suffix_len, *most = (getattr(self, f) for f in self.LEVEL)
        levels = ((per_group, suffix_len),)
        return self._groups(groups, prefix_len, levels, prefix_len_max=most[0] if most else None)

    def _groups(
        self, num_groups: int, prefix_len: int, levels: tuple[tuple[int, int], ...], **rest: Any
    ) -> PrefixGroups:
        """The family point with this config's names, output length and vocabulary."""
        return PrefixGroups(
            self.ID_PREFIX,
            self.GROUP_LABEL,
            num_groups,
            prefix_len,
            self.output_len,
            self.vocab_size,
            levels,
            **rest,
        )

    def check_shape(self, owner: str) -> None:
        if self.shape().min_prompt_len < 1:
            raise ValueError(f"{owner}: {self.PROMPT_LEN} must be >= 1")

    def generate(self, seed: int) -> list[Request]:
        return self.shape().generate(self.arrival, self.shuffle, seed, self.ignore_eos)


@dataclass(frozen=True)
class SharedPrefixWorkload(
    PrefixGroupWorkload,
    ids="sp",
    group="prefix",
    level=("num_groups", "system_prompt_len", "prompts_per_group", "question_len"),
):
    """`num_groups` system prompts, `prompts_per_group` questions behind each.

    SGLang's generated-shared-prefix shape (`bench_serving.py --dataset-name
    generated-shared-prefix`), the standard prefix-sharing benchmark, so results here line up
    with published SGLang runs. Request ids are "sp-NNNNNN", `group` is "prefix-G" and
    meta["prefix_len"] is the system prompt length. Two prompts of one group share exactly the
    system prompt (plus, by chance, a first question token with odds 1/vocab_size).
    `shuffle=False` keeps groups contiguous, the easy case for FCFS.
    """

    num_groups: int = 64
    prompts_per_group: int = 16
    system_prompt_len: int = 2048
    question_len: int = 128
    output_len: int = 256


@dataclass(frozen=True)
class LongPrefixWorkload(
    PrefixGroupWorkload,
    ids="lp",
    group="prefix",
    level=("num_prefixes", "prefix_len", "requests_per_prefix", "suffix_len", "prefix_len_max"),
):
    """`num_prefixes` long prefixes, `requests_per_prefix` short suffixes behind each.

    The paper's headline case (defaults: 5 prefixes of 10,000 tokens x 200 requests, the
    bench suite's `long-prefix`): one or a few prefixes of 5,000-10,000 tokens, many requests per
    prefix, a ~20-token suffix and short outputs, so decode reads mostly prefix KV, exactly
    where batch homogeneity pays. Prefix length is `prefix_len`, or, when `prefix_len_max` is
    set, drawn per prefix uniformly from [prefix_len, prefix_len_max]. Request ids are
    "lp-NNNNNN", `group` is "prefix-G", meta["prefix_len"] the group's prefix length.
    """

    num_prefixes: int = 5
    prefix_len: int = 10000
    prefix_len_max: int | None = None
    requests_per_prefix: int = 200
    suffix_len: int = 20
    output_len: int = 50

    MINIMUMS: ClassVar[dict[str, int | str]] = {
        **GeneratorConfig.MINIMUMS,
        "prefix_len_max": "prefix_len",
    }


@dataclass(frozen=True)
class DocumentQAWorkload(
    PrefixGroupWorkload,
    ids="dq",
    group="doc",
    level=("num_documents", "document_len", "questions_per_document", "question_len"),
):
    """`num_documents` documents, `questions_per_document` questions each; prompt = doc + question.

    Retrieval/long-context QA puts a whole document in front of every question, so the shared
    part is long and the distinct part short, like the paper's case but with more, mid-sized
    groups. Request ids are "dq-NNNNNN", `group` is "doc-D", meta["prefix_len"] the document
    length.
    """

    num_documents: int = 8
    document_len: int = 8000
    """Tokens of each document: the shared prefix of its questions."""
    questions_per_document: int = 16
    question_len: int = 64
    output_len: int = 128


@dataclass(frozen=True)
class TreeWorkload(
    PrefixGroupWorkload, ids="tr", group="tree", prompt_len="root_len + depth * branch_len"
):
    """`num_trees` trees: a root of `root_len` tokens, `branching` children per node.

    Agent scaffolds, few-shot variants and tree-of-thought searches extend one root prompt
    along branches; parallel sampling (n > 1) then asks for several completions of the same
    leaf. Siblings share the root plus the path to their parent and samples of one leaf share
    everything, so a scheduler that only knows "same prefix or not" sees several nested group
    sizes. Each of the `depth` levels adds a fresh random segment of `branch_len` tokens per
    node, so a leaf's prompt is root_len + depth * branch_len tokens, and every leaf is
    requested `samples_per_leaf` times with the identical prompt. Request ids are "tr-NNNNNN",
    `group` is "tree-T"; meta holds "tree", "path" (child index per level) and "sample".
    """

    num_trees: int = 8
    root_len: int = 1024
    branching: int = 4
    depth: int = 2
    branch_len: int = 256
    samples_per_leaf: int = 4
    output_len: int = 128

    MINIMUMS: ClassVar[dict[str, int | str]] = {**GeneratorConfig.MINIMUMS, "branching": 1}

    def shape(self) -> PrefixGroups:
        levels = ((self.branching, self.branch_len),) * self.depth
        return self._groups(
            self.num_trees, self.root_len, levels, samples=self.samples_per_leaf, meta_style="tree"
        )

    def check_shape(self, owner: str) -> None:
        super().check_shape(owner)
        leaves = self.branching**self.depth
        if leaves > MAX_LEAVES:
            raise ValueError(
                f"{owner}: branching**depth = {leaves} leaves per tree is over {MAX_LEAVES}"
            )
