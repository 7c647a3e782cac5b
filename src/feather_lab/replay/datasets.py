"""`vllm bench serve`'s generated datasets and arrivals, with its option names and meaning
(vllm/benchmarks/datasets/datasets.py, serve.py in vLLM 0.32), as token ids:

- `random` (`RandomDataset`): each request's input and output lengths drawn uniformly from
  the integers in [len * (1 - range_ratio), len * (1 + range_ratio)], a fixed random prefix
  of `--random-prefix-len` tokens shared by all, then the ids
  `(offset + index + arange(input_len)) % vocab` with a random offset per request;
- `prefix_repetition` (`PrefixRepetitionRandomDataset`): `--prefix-repetition-num-prefixes`
  random prefixes of `-prefix-len` tokens, each followed by `num_prompts // num_prefixes`
  random suffixes of `-suffix-len` tokens, `-output-len` output tokens each, shuffled;
- `sharegpt` (`ShareGPTDataset`): conversations from `--dataset-path`, as text through
  `--tokenizer` (replay/sharegpt.py);
- arrivals (`get_request` in serve.py): all at 0 with `--request-rate inf`, else gaps drawn
  from a gamma distribution of shape `--burstiness` and mean 1 / rate (1: Poisson), from
  the same seeded stream as vLLM's (`arrivals`).

For random and prefix_repetition vLLM draws ids, decodes them to text and sends the text;
this sends the ids, so prompts have their lengths exactly, or with `--tokenizer` the text as
vLLM makes it (`tokenizer.ids_as_text`). Ids avoid 0-3, the built-in
models' special tokens (`FIRST_ID`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from feather_lab.replay.sharegpt import sharegpt_requests
from feather_lab.replay.tokenizer import ids_as_text
from feather_lab.replay.workload import FIRST_ID, ReplayWorkload
from feather_sched.request import Request

DATASETS = ("random", "prefix_repetition", "sharegpt")


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
    dataset_path: str | None = None
    """sharegpt: the JSON file (replay/sharegpt.py)."""
    sharegpt_output_len: int | None = None
    """sharegpt: every request's output tokens (None: its completion's)."""

    def validate(self) -> None:
        """A ValueError naming the option and what is valid."""
        if self.name not in DATASETS:
            raise ValueError(f"--dataset-name {self.name!r}: valid: {', '.join(DATASETS)}")
        if self.name == "sharegpt" and self.dataset_path is None:
            raise ValueError("--dataset-name sharegpt: name its file: --dataset-path FILE")
        if self.name != "sharegpt" and self.dataset_path is not None:
            raise ValueError(f"--dataset-path goes with --dataset-name sharegpt, not {self.name}")
        if not 0.0 <= self.random_range_ratio < 1.0:
            raise ValueError(f"--random-range-ratio {self.random_range_ratio}: in [0, 1)")
        if self.request_rate <= 0 or self.burstiness <= 0:
            raise ValueError("--request-rate and --burstiness must be > 0 (rate may be inf)")
        if self.name == "prefix_repetition" and self.num_prompts < self.num_prefixes:
            raise ValueError(
                f"--num-prompts {self.num_prompts} < --prefix-repetition-num-prefixes "
                f"{self.num_prefixes}: each prefix needs a prompt"
            )


def arrivals(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """vLLM's arrival times (`get_request`): all 0 at rate inf; else gaps drawn one by one
    from numpy's global stream, which its `main` seeds with `--seed` (a `RandomState(seed)`
    here, the same draws), gamma of shape `burstiness` and mean 1 / rate (constant at
    burstiness inf), summed, and rescaled so the last request arrives at n / rate."""
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        gaps = np.random.RandomState(seed).gamma(burstiness, 1.0 / (rate * burstiness), n)
    times = np.cumsum(gaps)
    return times * (n / rate) / times[-1] if times[-1] > 0 else times


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


def _request(rid: str, ids: np.ndarray, out: int, tokenizer: Any, rng: Any) -> Request:
    """The ids as they are, or with a tokenizer as text (and the ids that text encodes to),
    as vLLM's client sends its random datasets."""
    if tokenizer is None:
        return Request(rid, ids.astype(np.int32), out)
    text, encoded = ids_as_text(tokenizer, ids, rng, FIRST_ID)
    return Request(rid, np.asarray(encoded, dtype=np.int32), out, meta={"text": text})


def dataset_workload(spec: DatasetSpec, vocab: int | None, tokenizer: Any = None) -> ReplayWorkload:
    """The dataset as one replay workload, its requests on vLLM's arrival schedule."""
    spec.validate()
    if spec.name == "sharegpt":
        if tokenizer is None:
            raise ValueError("--dataset-name sharegpt: its prompts are text: --tokenizer NAME")
        made = sharegpt_requests(
            spec.dataset_path, tokenizer, spec.num_prompts, spec.seed, spec.sharegpt_output_len
        )
    else:
        if vocab is None or vocab <= FIRST_ID:
            raise ValueError(
                f"--dataset-name {spec.name}: its token ids need the model's vocabulary (more "
                f"than {FIRST_ID} ids, got {vocab}): --vocab-size N, --tokenizer or --model"
            )
        rng = np.random.default_rng(spec.seed)
        pairs = (_random if spec.name == "random" else _prefix_repetition)(spec, vocab, rng)
        made = [
            _request(f"{spec.name}-{i:06d}", prompt, out, tokenizer, rng)
            for i, (prompt, out) in enumerate(pairs)
        ]
    for req, t in zip(made, arrivals(len(made), spec.request_rate, spec.burstiness, spec.seed)):
        req.arrival_time = float(t)
    params = {k: v for k, v in vars(spec).items() if k != "name"}
    return ReplayWorkload(spec.name, made, 0, params)
