"""The output cap (`max_tokens`) a client sets on a request whose answer ends at EOS.

A client does not know the answer's length: it sets one of a few round defaults and the
answer ends at the model's EOS below it. Generated workloads and traces without a cap take
the smallest of `CLIENT_CAPS` that is at least `HEADROOM` times the true output (the largest
when none is): a client picks its cap well above the answers it expects, so few are cut off.
The defaults are the round powers of two clients and SDKs ship (256 to 4,096; Anthropic's
Messages API requires a cap and its examples use 1,024; vLLM's OpenAI server, given none,
caps at the context left, `max_model_len - prompt_len`), so a 64-token answer runs under a
256-token cap, a 300-token answer under 1,024.
"""

from __future__ import annotations

CLIENT_CAPS = (256, 512, 1024, 2048, 4096)
"""Caps clients set, in tokens (smallest first)."""
HEADROOM = 2
"""A client's cap is at least this many times the answers it expects."""


def client_cap(output_len: int) -> int:
    """The cap a client sets on a request that answers `output_len` tokens (never below it)."""
    for cap in CLIENT_CAPS:
        if cap >= HEADROOM * output_len:
            return cap
    return max(CLIENT_CAPS[-1], int(output_len))
