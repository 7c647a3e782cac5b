"""Feather at cluster scale: a Ray Serve request router over vLLM replicas."""

from feather_sched._lazy import lazy_exports

__all__ = ["FeatherRequestRouter", "VllmReplica"]
__getattr__ = lazy_exports(
    __name__,
    {"FeatherRequestRouter": "feather_sched.ray.router", "VllmReplica": "feather_sched.ray.vllm"},
)
