"""`vllm bench serve`'s generated datasets and arrivals, with its option names and meaning
(vllm/benchmarks/datasets/datasets.py, serve.py in vLLM 0.32), as token ids:

- `random` (`RandomDataset`): each request's input and output lengths drawn uniformly from
  the integers in [len * (1 - range_ratio), len * (1 + range_ratio)], a fixed random prefix
  of `--random-prefix-len` tokens shared by all, then the ids
  `(offset + index + arange(input_len)) % vocab` with a random offset per request;
- `prefix_repetition` (`PrefixRepetitionRandomDataset`): `--prefix-repetition-num-prefixes`
  random prefixes of `-prefix-len` tokens, each followed by `num_prompts // num_prefixes`
  random suffixes of `-suffix-len` tokens, `-output-len` output tokens each, shuffled;
- arrivals (`get_request` in serve.py): all at 0 with `--request-rate inf`, else gaps drawn
  from a gamma distribution of shape `--burstiness` and mean 1 / rate (1: Poisson).

vLLM draws text and decodes it through the tokenizer; this sends the ids, so prompts have
their lengths exactly. Ids avoid 0-3, the built-in models' special tokens (`FIRST_ID`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from feather_lab.replay.workload import FIRST_ID, ReplayWorkload
from feather_sched.request import Request

DATASETS = ("random", "prefix_repetition")


@dataclass(frozen=True)
class DatasetSpec:
    """The options of `vllm bench serve` the datasets read (its defaults)."""

    name: str = "random"
    num_prompts: int = 1000
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    prefix_len: int = 256
    suffix_len: int = 256
    num_prefixes: int = 10
    prefix_output_len: int = 128

    def validate(self) -> None:
        """A ValueError naming the option and what is valid."""
        if self.name not in DATASETS:
            raise ValueError(f"--dataset-name {self.name!r}: valid: {', '.join(DATASETS)}")
        if not 0.0 <= self.random_range_ratio < 1.0:
            raise ValueError(f"--random-range-ratio {self.random_range_ratio}: in [0, 1)")
        if self.request_rate <= 0 or self.burstiness <= 0:
            raise ValueError("--request-rate and --burstiness must be > 0 (rate may be inf)")
        if self.name == "prefix_repetition" and self.num_prompts < self.num_prefixes:
            raise ValueError(
                f"--num-prompts {self.num_prompts} < --prefix-repetition-num-prefixes "
                f"{self.num_prefixes}: each prefix needs a prompt"
            )


def arrivals(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """vLLM's arrival times: all 0 at rate inf, else cumulative gamma gaps."""
    if math.isinf(rate):
        return np.zeros(n)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return np.cumsum(gaps) - gaps[0]


def _lengths(rng: np.random.Generator, n: int, mean: int, ratio: float) -> np.ndarray:
    low, high = max(1, math.floor(mean * (1 - ratio))), math.ceil(mean * (1 + ratio))
    return rng.integers(low, high + 1, size=n)


def _random(spec: DatasetSpec, vocab: int, rng: np.random.Generator) -> list[tuple]:
    n, ids = spec.num_prompts, vocab - FIRST_ID
    ins = _lengths(rng, n, spec.random_input_len, spec.random_range_ratio)
    outs = _lengths(rng, n, spec.random_output_len, spec.random_range_ratio)
    offsets = rng.integers(0, ids, size=n)
    prefix = rng.integers(0, ids, size=spec.random_prefix_len)
    out = []
    for i in range(n):
        body = (offsets[i] + i + np.arange(ins[i])) % ids
        out.append((np.concatenate([prefix, body]) + FIRST_ID, int(outs[i])))
    return out


def _prefix_repetition(spec: DatasetSpec, vocab: int, rng: np.random.Generator) -> list[tuple]:
    ids, per = vocab - FIRST_ID, spec.num_prompts // spec.num_prefixes
    out = []
    for _ in range(spec.num_prefixes):
        prefix = rng.integers(0, ids, size=spec.prefix_len)
        for _ in range(per):
            suffix = rng.integers(0, ids, size=spec.suffix_len)
            out.append((np.concatenate([prefix, suffix]) + FIRST_ID, spec.prefix_output_len))
    rng.shuffle(out)
    return out


def dataset_workload(spec: DatasetSpec, vocab: int) -> ReplayWorkload:
    """The dataset as one replay workload, its requests on vLLM's arrival schedule."""
    spec.validate()
    if vocab <= FIRST_ID:
        raise ValueError(f"--vocab-size {vocab}: the model needs more than {FIRST_ID} tokens")
    rng = np.random.default_rng(spec.seed)
    made = (
        _random(spec, vocab, rng) if spec.name == "random" else _prefix_repetition(spec, vocab, rng)
    )
    times = arrivals(len(made), spec.request_rate, spec.burstiness, rng)
    requests = [
        Request(f"{spec.name}-{i:06d}", prompt.astype(np.int32), out, float(t))
        for i, ((prompt, out), t) in enumerate(zip(made, times))
    ]
    params = {k: v for k, v in vars(spec).items() if k != "name"}
    return ReplayWorkload(spec.name, requests, 0, params)
