"""Context limits: a request the model cannot serve is an error before the run, or dropped.

vLLM and SGLang reject a request whose prompt plus requested output exceeds the model's
context (vLLM's "This model's maximum context length is ..."); a bench that served it anyway
would credit a policy with tokens no engine produces. So every bench checks its requests
against the model's `max_context_tokens` (a model profile field; `max_model_len` for a real
engine) before any work starts: an error names how many and which, unless the user asked
to drop them (`--drop-overlong`), in which case the row says how many were dropped. A
request that depends on a dropped one (a later turn of the same conversation) is dropped too.
"""

from __future__ import annotations

from collections.abc import Sequence

from feather_sched.request import Request


class OverlongError(ValueError):
    """Requests longer than the model's context, and no leave to drop them."""


def fit_context(
    requests: Sequence[Request], limit: int, drop: bool, source: str
) -> tuple[list[Request], int]:
    """The requests that fit `limit` tokens (prompt + output) and how many were dropped.

    `limit` <= 0 means unknown: nothing is checked. Without `drop`, any overlong request
    raises OverlongError naming the count, the limit and the longest few.
    """
    if limit <= 0:
        return list(requests), 0
    over = {r.request_id for r in requests if r.prompt_len + r.output_len > limit}
    if not over:
        return list(requests), 0
    if not drop:
        longest = sorted(
            (r for r in requests if r.request_id in over),
            key=lambda r: -(r.prompt_len + r.output_len),
        )[:3]
        named = ", ".join(f"{r.request_id} ({r.prompt_len + r.output_len:,})" for r in longest)
        raise OverlongError(
            f"{source}: {len(over):,} of {len(requests):,} requests exceed the model's context "
            f"of {limit:,} tokens (prompt + output), e.g. {named}; pass --drop-overlong to "
            "drop them (counted in the row), or use a model with a longer context"
        )
    while True:  # later turns of a dropped conversation, to any depth
        orphans = {
            r.request_id
            for r in requests
            if r.request_id not in over and r.meta.get("depends_on") in over
        }
        if not orphans:
            break
        over |= orphans
    return [r for r in requests if r.request_id not in over], len(over)
