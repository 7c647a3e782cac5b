"""Step-time samples of one composition on a real vLLM engine.

Every engine iteration is timed (`LLMEngine.step`, wall clock) and paired with its exact
BatchShape, read from vLLM's block tables at scheduling time. Decode steps of one composition
are near-identical, so they collapse to one sample (median time); every step that prefills is
its own sample.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import numpy as np

from feather_lab.harness.vllm_steps import StepProbe
from feather_sched.cost import BatchShape
from feather_sched.cost.composition import Composition
from feather_sched.vllm.local import scheduler_of


@dataclass
class Sample:
    composition: str
    kind: str
    """Sample kind: decode (the median of a composition's full-batch decode steps), or
    prefill / mixed (one step with prefill work; mixed: with decodes in the same step)."""
    shape: BatchShape
    seconds: float


def measure(llm, comp: Composition, vocab: int, seed: int) -> list[Sample]:
    """Serve one composition from an empty prefix cache; its samples."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = np.random.default_rng(seed)
    engine = llm.llm_engine
    llm.reset_prefix_cache()
    prefixes = [rng.integers(4, vocab, comp.prefix_len) for _ in range(comp.prefixes)]
    # The first requests decode while later ones still prefill (chunked, one token budget a
    # step): give every request enough tokens to outlast the prefill, so `decode_steps` steps
    # of the whole batch decoding together follow it.
    budget = llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    prefill = comp.prefixes * comp.prefix_len + comp.batch * comp.suffix_len
    params = SamplingParams(
        max_tokens=comp.decode_steps + 1 + math.ceil(prefill / budget),
        ignore_eos=True,
        temperature=0.0,
        detokenize=False,
    )
    prompts = [
        np.concatenate([prefixes[comp.prefix_of(i)], rng.integers(4, vocab, comp.suffix_len)])
        for i in range(comp.batch)
    ]
    late = prompts[comp.batch - comp.late :]

    def add(i: int, ids: np.ndarray) -> None:
        prompt = TokensPrompt(prompt_token_ids=ids.tolist())
        engine.add_request(f"cal-{comp.label}-{i}", prompt, params)

    for i, ids in enumerate(prompts[: comp.batch - comp.late]):
        add(i, ids)
    timed: list[tuple[BatchShape, float]] = []
    with StepProbe(scheduler_of(llm), record_shapes=True) as probe:
        assert probe.shapes is not None
        while engine.has_unfinished_requests():
            if late and timed and not timed[-1][0].num_prefill_seqs:
                add(comp.batch - len(late), late.pop(0))  # one arrival while others decode
            before = len(probe.shapes)
            t0 = time.perf_counter()
            engine.step()
            dt = time.perf_counter() - t0
            if len(probe.shapes) == before + 1:
                timed.append((probe.shapes[-1], dt))
    samples = [
        Sample(comp.label, "mixed" if shape.num_decode else "prefill", shape, dt)
        for shape, dt in timed
        if shape.num_prefill_seqs
    ]
    decode = [(s, dt) for s, dt in timed if not s.num_prefill_seqs and s.num_decode == comp.batch]
    if decode:
        # The middle step's shape (by order: context grows by one token a step) and the
        # median time of all of them.
        median = statistics.median(dt for _, dt in decode)
        samples.append(Sample(comp.label, "decode", decode[len(decode) // 2][0], median))
    return samples


def median_of_passes(passes: list[list[Sample]]) -> list[Sample]:
    """One sample per (composition, kind, index) present in every pass: the median time.
    Shapes agree across passes (the same prompts are served from an empty cache)."""
    keyed: list[dict[tuple[str, str, int], Sample]] = []
    for samples in passes:
        seen: dict[tuple[str, str], int] = {}
        d = {}
        for smp in samples:
            i = seen[smp.composition, smp.kind] = seen.get((smp.composition, smp.kind), -1) + 1
            d[smp.composition, smp.kind, i] = smp
        keyed.append(d)
    return [
        Sample(key[0], key[1], first.shape, statistics.median(d[key].seconds for d in keyed))
        for key, first in keyed[0].items()
        if all(key in d for d in keyed[1:])
    ]


def split(samples: list[Sample], every: int) -> tuple[list[Sample], list[Sample]]:
    """Train / held-out by composition: every `every`-th composition is held out."""
    labels = list(dict.fromkeys(s.composition for s in samples))
    held = set(labels[every - 1 :: every]) if every > 1 else set()
    return [s for s in samples if s.composition not in held], [
        s for s in samples if s.composition in held
    ]
