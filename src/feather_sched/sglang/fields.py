"""What Feather reads off SGLang's `Req` (srt/managers/schedule_batch.py), without importing
SGLang: `rid`, `origin_input_ids` (an `array('q')`), the sampling params' `max_new_tokens`."""

from __future__ import annotations

from array import array
from operator import attrgetter
from typing import Any

import numpy as np

from feather_sched.host.tracker import RequestFields
from feather_sched.policies.kv_gate import CLIP_TOKENS

rid_of = attrgetter("rid")


def prompt_tokens(req: Any) -> np.ndarray:
    """A request's prompt as an int64 array, without copying SGLang's `array('q')`."""
    ids = req.origin_input_ids
    if isinstance(ids, array) and ids.itemsize == 8:
        return np.frombuffer(ids, dtype=np.int64) if len(ids) else np.zeros(0, np.int64)
    return np.asarray(ids, dtype=np.int64)


def max_new_tokens(req: Any) -> int | None:
    return getattr(getattr(req, "sampling_params", None), "max_new_tokens", None)


def _prompt_len(req: Any) -> int:
    return len(req.origin_input_ids)


SGLANG_FIELDS = RequestFields(
    request_id=rid_of,
    prompt=prompt_tokens,
    max_tokens=max_new_tokens,
    prompt_len=_prompt_len,
)
"""SGLang's `Req` (srt/managers/schedule_batch.py): `rid`, `origin_input_ids`, the sampling
params' `max_new_tokens`; no block hashes (the prompt is hashed once, when first seen)."""


def kv_need(req: Any, cached: int) -> int:
    """KV tokens `req` takes with `cached` prompt tokens in the cache: the rest of its prompt
    and its output (clipped as SGLang's adder clips it, `CLIP_MAX_NEW_TOKENS`)."""
    out = max_new_tokens(req) or 0
    return max(0, len(req.origin_input_ids) - cached) + min(int(out), CLIP_TOKENS)
