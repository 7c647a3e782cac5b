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
