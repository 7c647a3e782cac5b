"""`--dataset-name sharegpt --dataset-path FILE`: ShareGPT conversations as `vllm bench serve`
samples them (vllm/benchmarks/datasets/datasets.py, `ShareGPTDataset`, vLLM 0.32):

- the file is a JSON list of entries; an entry counts when it has `conversations` with at least
  two turns (`load_data`), and the entries are shuffled with Python's `random.seed(seed)`
  (its `--seed`; vLLM's `--disable-shuffle` is not offered);
- the first turn's `value` is the prompt, the second's the completion, whoever said them
  (`sample`): the prompt's tokens are its input, the completion's token count its output
  length unless `--sharegpt-output-len` fixes it;
- a pair is skipped unless the prompt has 4 to 1,024 tokens, prompt plus output at most 2,048,
  and (without `--sharegpt-output-len`) the output at least 4 (`is_valid_sequence`);
- with fewer valid pairs than `--num-prompts`, random ones are repeated to make up the number
  (`maybe_oversample_requests`, `random.seed(seed)` again).

The prompt is sent as its text (the server tokenizes it, as for vLLM's client); the token ids
from the tokenizer count its length and check it fits the server's vocabulary and context.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from feather_sched.request import Request

MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048
"""`is_valid_sequence`'s defaults, the bounds vLLM's ShareGPT sampling uses."""


def load_conversations(path: str | Path) -> list[tuple[str, str]]:
    """(prompt, completion) of every entry vLLM counts, in file order; a ValueError names the
    file and what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"--dataset-path {path}: cannot read it ({err.strerror})") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"--dataset-path {path}: not JSON ({err})") from None
    if not isinstance(data, list):
        raise ValueError(f"--dataset-path {path}: a ShareGPT file is a JSON list of entries")
    pairs = []
    for i, entry in enumerate(data):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns[:2]):
            raise ValueError(
                f"--dataset-path {path}: entry {i}: each turn needs a text `value` "
                '(ShareGPT: {"conversations": [{"from": ..., "value": ...}, ...]})'
            )
        pairs.append((first["value"], second["value"]))
    if not pairs:
        raise ValueError(f"--dataset-path {path}: no entry has `conversations` of 2+ turns")
    return pairs


def _valid(prompt_len: int, output_len: int, fixed_output: bool) -> bool:
    return (
        MIN_LEN <= prompt_len <= MAX_PROMPT_LEN
        and (fixed_output or output_len >= MIN_LEN)
        and prompt_len + output_len <= MAX_TOTAL_LEN
    )


def sharegpt_requests(
    path: str | Path, tokenizer: Any, num_prompts: int, seed: int, output_len: int | None
) -> list[Request]:
    """`num_prompts` requests from the file, as vLLM samples them (the module doc); arrival
    times are left at 0 for the caller's schedule."""
    pairs = load_conversations(path)
    random.seed(seed)
    random.shuffle(pairs)
    picked: list[Request] = []
    for prompt, completion in pairs:
        if len(picked) >= num_prompts:
            break
        ids = tokenizer(prompt).input_ids
        out = len(tokenizer(completion).input_ids) if output_len is None else output_len
        if not _valid(len(ids), out, output_len is not None):
            continue
        rid = f"sharegpt-{len(picked):06d}"
        picked.append(Request(rid, np.asarray(ids, dtype=np.int32), out, meta={"text": prompt}))
    if not picked:
        raise ValueError(
            f"--dataset-path {path}: no conversation has a prompt of {MIN_LEN}-{MAX_PROMPT_LEN} "
            f"tokens and prompt plus output of at most {MAX_TOTAL_LEN} (vLLM's bounds)"
        )
    random.seed(seed)
    valid = list(picked)
    while len(picked) < num_prompts:  # vLLM oversamples: random valid pairs again
        again = random.choice(valid)
        rid = f"sharegpt-{len(picked):06d}"
        picked.append(Request(rid, again.prompt, again.output_len, meta=dict(again.meta)))
    return picked
