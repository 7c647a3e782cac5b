"""The in-process vLLM engine the harness runs: environment, model, construction, policy.

In process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the harness can read and wrap the live
scheduler; the built-in random-weight models are built once into the cache folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from feather_lab.harness.vllm_spec import (  # noqa: F401 (re-exported for the bench's callers)
    BASELINE,
    ENGINE_SCALES,
    EOS_TERMINALS,
    EngineScale,
    KvScenario,
    VllmBenchSpec,
    engine_scale,
    engine_workload,
)
from feather_sched.vllm.local import CPU_THREAD_DEFAULTS, scheduler_of


def engine_env_defaults() -> None:
    """In-process engine (the bench reads the live scheduler), quiet logs, CPU threads."""
    for key, value in {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": "ERROR",
        **CPU_THREAD_DEFAULTS,
    }.items():
        os.environ.setdefault(key, value)


def require_vllm() -> None:
    """Fail with the install recipe when vLLM is missing (the main venv has no vLLM)."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise RuntimeError(
            "--engine vllm needs vLLM: pip install torch==2.13.0 && pip install -e '.[vllm]' "
            "&& pip uninstall -y torchvision torchaudio torchcodec  (see pyproject.toml)"
        ) from err
    from feather_sched.host.versions import check_engine_version

    check_engine_version("vllm")


@contextmanager
def scoped_env(**values: str) -> Iterator[None]:
    """Set environment variables for the block; restore them after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def model_dir(spec: VllmBenchSpec, cache: Path | None = None) -> tuple[str, str, int]:
    """(model path, dtype, vocab size): the given HF dir, or a built-in model (built once)."""
    from feather_lab.harness.tiny_llama import ENGINE_MODELS, build_tiny_llama

    name = spec.model or "tiny-llama"
    if name not in ENGINE_MODELS:
        config = json.loads((Path(name) / "config.json").read_text())
        return name, spec.dtype, int(config["vocab_size"])
    built = ENGINE_MODELS[name]
    folder = name
    if not spec.ignore_eos:  # outputs end at EOS: the walk variant
        built = dataclasses.replace(built, eos_terminals=EOS_TERMINALS)
        folder = f"{name}-eos{EOS_TERMINALS}"
    root = cache or Path(os.environ.get("FEATHER_CACHE", Path.home() / ".cache" / "feather"))
    path = build_tiny_llama(root / folder, built)
    return str(path), built.dtype, built.vocab_size


def make_llm(spec: VllmBenchSpec, path: str, dtype: str, num_blocks: int, feather: bool):
    """An in-process engine; `feather` selects FeatherScheduler (policy set per run)."""
    from vllm import LLM

    kwargs: dict[str, Any] = dict(
        dtype=dtype,
        max_model_len=spec.max_model_len,
        block_size=spec.block_size,
        num_gpu_blocks_override=num_blocks,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        gpu_memory_utilization=0.3,
        enforce_eager=True,
        seed=spec.seed,
    )
    if feather:
        kwargs["scheduler_cls"] = "feather_sched.vllm.FeatherScheduler"
    if spec.async_scheduling:
        kwargs["async_scheduling"] = True
    with scoped_env(FEATHER_POLICY="fcfs"), keep_async_scheduling(spec.async_scheduling):
        # FEATHER_POLICY is replaced per run; fcfs needs no options
        return LLM(path, **kwargs)


@contextmanager
def keep_async_scheduling(enabled: bool = True) -> Iterator[None]:
    """Let an engine built inside this block keep `async_scheduling=True` on CPU.

    vLLM's CPU platform switches async scheduling off ("not required on CPU":
    vllm/platforms/cpu.py `check_and_update_config`), though its CPU model runner runs the
    pipelined loop (`EngineCore.step_with_batch_queue`) fine. This keeps what the config
    asked for, for engines built in the block only, so the GPU default can be exercised on
    CPU. Elsewhere (GPU platforms) it changes nothing.
    """
    if not enabled:
        yield
        return
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.__dict__["check_and_update_config"]

    def keep(cls, vllm_config) -> None:
        wanted = vllm_config.scheduler_config.async_scheduling
        original.__func__(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = wanted

    CpuPlatform.check_and_update_config = classmethod(keep)
    try:
        yield
    finally:
        CpuPlatform.check_and_update_config = original


def warm_up(llm, vocab: int) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = np.random.default_rng(0)
    prompts = [TokensPrompt(prompt_token_ids=rng.integers(4, vocab, 64).tolist()) for _ in range(4)]
    llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)


def set_policy(llm, name: str, options: dict[str, Any]) -> None:
    from feather_sched.policies.registry import make_policy

    scheduler_of(llm).feather.policy = make_policy(name, **options)
