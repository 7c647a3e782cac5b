"""An in-process vLLM engine's plumbing, shared by the Ray replicas (`ray_vllm`) and the bench
harness (`harness.vllm_engine`): no vLLM import here, so either can load it first."""

from __future__ import annotations

from typing import Any

CPU_THREAD_DEFAULTS = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
"""vLLM's CPU build on a small machine: one OpenMP thread, no core binding."""


def scheduler_of(llm: Any) -> Any:
    """The live scheduler of an in-process `vllm.LLM` (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    return llm.llm_engine.engine_core.engine_core.scheduler
