"""Feather in vLLM V1, loaded by vLLM's own `--scheduler-cls`:

vllm serve MODEL --scheduler-cls feather_sched.vllm.FeatherScheduler
"""

from feather_sched._lazy import lazy_exports

__all__ = ["FeatherAsyncScheduler", "FeatherScheduler"]
__getattr__ = lazy_exports(__name__, dict.fromkeys(__all__, "feather_sched.vllm.scheduler"))
