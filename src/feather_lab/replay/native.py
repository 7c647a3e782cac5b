"""SGLang's native `POST /generate` (`--api generate`), beside the OpenAI `/v1/completions`
the client speaks by default: prompts as `input_ids`, the output length in
`sampling_params` (`max_new_tokens`, `ignore_eos`), streamed as server-sent events of
`{"text", "output_ids", "meta_info": {"completion_tokens", "finish_reason", ...}}` and a
final `[DONE]`, as sglang 0.5's `entrypoints/http_server.py` serves it and its own
`bench_serving` reads it. A chunk counts as a token arrival when `completion_tokens` grows
(the text of a random-weight model's token may be empty); the stream itself (the end
marker, error events, the final count) is read as the completions API's
(`client.read_stream`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from feather_sched.request import Request

PATH = "/generate"


def generate_body(req: Request, stream_interval: int = 1) -> dict[str, Any]:
    """A streamed generation of exactly `req.output_len` tokens from its token ids;
    `stream_interval` > 1 goes in `sampling_params` (SGLang's per-request setting, over
    its server's `--stream-interval`)."""
    params: dict[str, Any] = {"max_new_tokens": req.output_len, "ignore_eos": True}
    params["temperature"] = 0.0
    if stream_interval > 1:
        params["stream_interval"] = stream_interval
    text = req.meta.get("text")
    prompt = {"input_ids": req.prompt.tolist()} if text is None else {"text": text}
    return {**prompt, "sampling_params": params, "stream": True}


def take_generate(event: dict[str, Any], out: Any, clock: Callable[[], float]) -> None:
    """One `/generate` event into `out` (a client `Outcome`): a chunk time each time the
    completion grows, and its token count so far (the client checks the final one)."""
    tokens = int((event.get("meta_info") or {}).get("completion_tokens", 0))
    if tokens > out.tokens:
        out.chunk_s.append(clock())
        out.tokens = tokens
