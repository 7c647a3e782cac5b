"""What `feather calibrate --engine vllm` measures, fits and compares."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from feather_lab.harness.vllm_spec import VllmBenchSpec

COMPARE_POLICIES = ("grouped", "feather")
"""The policies a calibration compares end to end by default (beside vLLM's own)."""


@dataclass(frozen=True)
class CalibrateSpec:
    """What `feather calibrate` measures, fits and compares: the composition grid and the
    fit's own settings, around the one bench spec both engines are built from."""

    bench: VllmBenchSpec = field(default_factory=lambda: VllmBenchSpec(policies=COMPARE_POLICIES))
    """The real-engine bench the fitted model is compared with end to end (its `repeats`:
    runs per configuration). Its model, block size, context length and token budget also
    build the grid's engine, so the measured steps and the compared runs share one engine
    configuration."""
    base_hardware: str = "cpu"
    model_profile: str | None = None
    """Model profile (name or JSON) for the cost model; None: the built-in model's own."""
    kv_blocks: int | None = None
    """KV blocks of the grid's engine; None: the bench's largest scenario."""
    holdout_every: int = 4
    passes: int = 5
    """Passes over the composition grid; each sample's time is the median over passes."""
    quick: bool = False
    bench_rows: list[dict[str, Any]] | None = field(default=None, compare=False)
    """Real-engine rows from `feather bench --engine vllm` to compare with (None: run them)."""

    def record(self) -> dict[str, Any]:
        """The spec as a calibration report stores it: the compared bench's fields under the
        report's established names (`compare_*`), so reports stay comparable across runs."""
        bench = asdict(self.bench)
        return {
            "model": bench["model"],
            "base_hardware": self.base_hardware,
            "model_profile": self.model_profile,
            "block_size": bench["block_size"],
            "max_model_len": bench["max_model_len"],
            "max_num_batched_tokens": bench["max_num_batched_tokens"],
            "kv_blocks": self.kv_blocks,
            "holdout_every": self.holdout_every,
            "repeats": self.passes,
            "quick": self.quick,
            "seed": bench["seed"],
            "compare_workloads": bench["workloads"],
            "compare_policies": bench["policies"],
            "compare_scenarios": bench["scenarios"],
            "compare_repeats": bench["repeats"],
            "policy_options": bench["policy_options"],
        }
