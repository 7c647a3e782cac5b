"""Named workload settings, one table for every place that runs workloads by name.

The simulator bench (`bench.suite`), PPO training (`rl.train`) and the real-engine bench
(engine-scaled shapes) each need the same few shapes at their own sizes; the paper's scenario
in particular used to be written out once per caller. Here each shape is written once, as
data: `PRESETS[scale][name]` is a generator name, its field overrides and the engine settings
it needs, for scale "sim" (the `feather bench` suite), "train" (the PPO training mix), and the
built-in engine models ("tiny-llama", "kv-bound": prompts fit their context, ids their vocab).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from feather_lab.workloads.base import Workload
from feather_lab.workloads.registry import make_workload

__all__ = [
    "DEFAULT_MAX_NUM_SEQS",
    "PAPER_SHAPE",
    "PRESETS",
    "Preset",
    "build_workload",
    "paper",
]

DEFAULT_MAX_NUM_SEQS = 256
"""The engine's batch cap when a preset does not set one (EngineConfig's default)."""


@dataclass(frozen=True)
class Preset:
    """A named workload: a generator with overrides, plus the engine settings it needs."""

    base: str
    overrides: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    bounds: tuple[str, ...] = ()
    """Limit rows the bench adds beside the policies (`bench.suite.UNBOUNDED_KV`)."""

    @property
    def max_num_seqs(self) -> int:
        """The batch cap this workload is meant to run with."""
        return int(self.engine.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS))

    def build(self) -> Workload:
        return make_workload(self.base, **self.overrides)


PAPER_SHAPE: dict[str, Any] = {
    "prefix_len": 5000,
    "prefix_len_max": 10000,
    "suffix_len": 20,
    "output_len": 50,
    "arrival": "poisson:1000",
}
"""The paper's synthetic scenarios: prefixes of 5,000-10,000 tokens, 20-token suffixes, 50
output tokens, Poisson arrivals (run at max batch 500). At 1,000 requests/s the engine stays
saturated, so throughput measures the scheduler, not the arrival rate."""


def paper(groups: int, requests: int = 1000) -> Preset:
    """The paper's scenario with `groups` prefixes and about `requests` requests in all."""
    return Preset(
        "long-prefix",
        {"num_prefixes": groups, "requests_per_prefix": max(1, requests // groups), **PAPER_SHAPE},
        {"max_num_seqs": 500},
    )


def _engine_paper(groups: int) -> Preset:
    """The paper's scenario at engine scale: `groups` 2,048-token prefixes (8 MiB of KV per
    layer each on kv-bound), 256 requests in all, 16-token suffixes, 128 output tokens (so
    decoding, not the ~25 s of prefill a CPU needs for 32 prefixes, is most of a run),
    shuffled, all arriving at once."""
    shape = {"prefix_len": 2048, "suffix_len": 16, "output_len": 128}
    return Preset(
        "long-prefix", {"num_prefixes": groups, "requests_per_prefix": 256 // groups, **shape}
    )


PRESETS: dict[str, dict[str, Preset]] = {
    # The `feather bench` suite (H100 + Llama-3-8B by default). Sizes keep a full run in a few
    # minutes on 2 CPU cores while each workload still fills the engine's batches.
    "sim": {
        # SGLang's generated-shared-prefix shape: 64 system prompts x 16 questions.
        "shared-prefix": Preset("shared-prefix"),
        # The paper's long-prefix case: 5 groups of 10,000-token prefixes, 20-token suffixes
        # (the generator's defaults: one name, one workload, in the bench and in Python).
        "long-prefix": Preset("long-prefix"),
        "document-qa": Preset("document-qa"),
        "no-sharing": Preset("no-sharing"),
        **{f"paper-{g}g": paper(g) for g in (1, 2, 5, 20, 100)},
        # Where the GPU lever is real (benchmarks/gpu/README.md: KV capacity, not L2 locality): 64
        # agent or document sessions whose contexts of 10k-60k tokens (2.2M tokens in all)
        # outgrow an H200's KV cache (~0.83M tokens for Llama-3.1-8B), each asked 6
        # follow-ups (tool calls, questions) of 128 new tokens with 256-token answers, as
        # they arrive (Poisson, 8 requests/s). With the unbounded-KV bound beside it.
        "long-context": Preset(
            "long-prefix",
            {
                "num_prefixes": 64,
                "prefix_len": 10000,
                "prefix_len_max": 60000,
                "requests_per_prefix": 6,
                "suffix_len": 128,
                "output_len": 256,
                "arrival": "poisson:8",
            },
            bounds=("bound:unbounded-kv",),
        ),
    },
    # PPO's training mix: the workloads where the ADD/STOP choice matters, scaled down so an
    # episode simulates in well under a second (no-sharing never asks a decision).
    "train": {
        **{f"paper-{g}g": paper(g, 400) for g in (2, 5, 20, 100)},
        "long-prefix-5x60": Preset("long-prefix", {"num_prefixes": 5, "requests_per_prefix": 60}),
        "long-prefix-3x40": Preset(
            "long-prefix", {"num_prefixes": 3, "prefix_len": 4000, "requests_per_prefix": 40}
        ),
        "shared-prefix-32g": Preset("shared-prefix", {"num_groups": 32}),
        "shared-prefix-8x32": Preset(
            "shared-prefix", {"num_groups": 8, "prompts_per_group": 32, "output_len": 128}
        ),
        "document-qa": Preset("document-qa"),
    },
    # The sim suite's shapes scaled to the tiny engine model (max_model_len 1024, vocab 512).
    "tiny-llama": {
        # 8 system prompts x 16 questions; 512-token prefixes, 32-token questions.
        "shared-prefix": Preset(
            "shared-prefix",
            {
                "num_groups": 8,
                "prompts_per_group": 16,
                "system_prompt_len": 512,
                "question_len": 32,
                "output_len": 64,
            },
        ),
        # Same prompt and output lengths, nothing shared: the control case.
        "no-sharing": Preset(
            "no-sharing", {"num_requests": 128, "prompt_len": 544, "output_len": 64}
        ),
        "long-prefix": Preset(
            "long-prefix",
            {
                "num_prefixes": 4,
                "prefix_len": 768,
                "requests_per_prefix": 32,
                "suffix_len": 16,
                "output_len": 32,
            },
        ),
        "document-qa": Preset(
            "document-qa",
            {
                "num_documents": 8,
                "document_len": 512,
                "questions_per_document": 16,
                "question_len": 32,
                "output_len": 64,
            },
        ),
    },
    # The KV-bound engine model: decode reads dominate, so the batch's prefix mix sets the
    # step time.
    "kv-bound": {
        "paper-4g": _engine_paper(4),
        "paper-32g": _engine_paper(32),
        # Same prompt and output lengths, nothing shared (32 requests keep its prefill, the
        # slowest part on a CPU at ~2,800 tokens/s, to ~25 s).
        "no-sharing": Preset(
            "no-sharing", {"num_requests": 32, "prompt_len": 2064, "output_len": 64}
        ),
    },
}


def build_workload(name: str, scale: str = "sim") -> Workload:
    """A preset of `scale` by name, else any generator by name or a trace (`trace:PATH`)."""
    preset = PRESETS[scale].get(name)
    return preset.build() if preset is not None else make_workload(name)
