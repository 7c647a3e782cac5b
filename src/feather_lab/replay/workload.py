"""What `feather replay` sends: the bench's workloads (`bench.prepare.fitted_workload`: names,
`trace:PATH`, arrivals, rate scale, limit, context fit), with token ids the server's model
takes. A built-in engine model (`--model tiny-llama` or `kv-bound`, served from the
directory `harness.tiny_llama` builds) gets its own engine-sized presets and vocabulary, the
very requests `feather bench --engine vllm --model NAME` runs in process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from feather_lab.bench.prepare import fitted_workload
from feather_lab.bench.suite import BenchSpec
from feather_lab.harness.tiny_llama import ENGINE_MODELS
from feather_sched.request import Request

FIRST_ID = 4
"""The built-in models' ids 0-3 are the tokenizer's specials; prompts use 4.. (as the
in-process bench's `engine_workload`)."""


@dataclass(frozen=True)
class ReplayWorkload:
    name: str
    requests: list[Request]
    dropped: int
    params: dict[str, Any]


def replay_workloads(
    spec: BenchSpec, model: str | None, vocab_size: int | None, context: int | None
) -> list[ReplayWorkload]:
    """Every workload of `spec` (and each of its `rates`), built and fitted to the server's
    `context` before anything is sent; a ValueError names a bad value. `model`: a built-in
    engine model's presets and vocabulary; else the simulator suite's, with `vocab_size`
    (None: each generator's own)."""
    spec.validate()
    if model is not None and model not in ENGINE_MODELS:
        raise ValueError(f"--model {model!r}: valid: {', '.join(ENGINE_MODELS)} (or leave it out)")
    scale = model or "sim"
    vocab = ENGINE_MODELS[model].vocab_size if model else vocab_size
    out = []
    for name in spec.workloads:
        for rate in spec.rates or (None,):
            requests, dropped, params = fitted_workload(
                name, spec, context or 0, model or "the server's model", rate, scale, vocab
            )
            if not requests:
                raise ValueError(f"workload {name!r} has no requests to send")
            if model is not None:
                for r in requests:
                    r.prompt = np.maximum(r.prompt, FIRST_ID).astype(np.int32)
            key = name if rate is None else f"{name}@{rate:g}/s"
            out.append(ReplayWorkload(key, requests, dropped, params))
    return out
