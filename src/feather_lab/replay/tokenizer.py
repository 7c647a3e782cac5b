"""`--tokenizer NAME_OR_PATH`: the model's tokenizer for `feather replay`, as `vllm bench serve`
loads it (transformers' `AutoTokenizer`, a hub name or a local directory). Prompts given as
text (ShareGPT) are counted and checked through it, and its vocabulary bounds the token ids
of the generated datasets."""

from __future__ import annotations

import importlib.util
from typing import Any


def load_tokenizer(name: str) -> Any:
    """The tokenizer, or a ValueError naming `name` and why it cannot be loaded."""
    if importlib.util.find_spec("transformers") is None:
        raise ValueError(
            f"--tokenizer {name}: needs transformers (pip install transformers), as vLLM's "
            "client does"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"--tokenizer {name}: cannot be loaded ({err})") from None


def vocab_size(tokenizer: Any) -> int:
    """Ids the tokenizer knows, added tokens included (vLLM's `len(tokenizer)`)."""
    return len(tokenizer)


def ids_as_text(tokenizer: Any, ids: Any, rng: Any, first_id: int, tries: int = 10) -> tuple:
    """(text, its token ids): `ids` decoded to text and encoded back, as vLLM's random
    datasets make their prompts (`gen_prompt_decode_to_target_len`): where the round trip
    changes the length, trimmed or padded with random ids (from `first_id` up) and tried
    again, at most `tries` times."""
    target, seq = len(ids), [int(i) for i in ids]
    for _ in range(tries):
        text = tokenizer.decode(seq)
        seq = tokenizer.encode(text, add_special_tokens=False)
        if len(seq) == target:
            return text, seq
        if len(seq) < target:
            seq += rng.integers(first_id, vocab_size(tokenizer), size=target - len(seq)).tolist()
        else:
            seq = seq[:target]
    text = tokenizer.decode(seq)
    return text, tokenizer.encode(text, add_special_tokens=False)
