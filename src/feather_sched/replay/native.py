"""SGLang's native `POST /generate` (`--api generate`), beside the OpenAI `/v1/completions`
the client speaks by default: prompts as `input_ids`, the output length in
`sampling_params` (`max_new_tokens`, `ignore_eos`), streamed as server-sent events of
`{"text", "output_ids", "meta_info": {"completion_tokens", "finish_reason", ...}}` and a
final `[DONE]`, as sglang 0.5's `entrypoints/http_server.py` serves it and its own
`bench_serving` reads it. A chunk counts as a token arrival when `completion_tokens` grows
(the text of a random-weight model's token may be empty); an `{"error": ...}` event fails
the request as the completions API's does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

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
    return {"input_ids": req.prompt.tolist(), "sampling_params": params, "stream": True}


async def read_generate_stream(resp: httpx.Response, out: Any, clock: Callable[[], float]) -> None:
    """The events of one `/generate` stream into `out` (a client `Outcome`): a chunk time
    each time the completion grows, its final token count, the end marker checked."""
    finished = False
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            finished = True
            break
        event = json.loads(data)
        if "error" in event:
            out.error = f"error event: {str(event['error'])[:200]}"
            return
        tokens = int((event.get("meta_info") or {}).get("completion_tokens", 0))
        if tokens > out.tokens:
            out.chunk_s.append(clock())
            out.tokens = tokens
    if not finished:
        out.error = f"stream ended without [DONE] after {len(out.chunk_s)} chunks"
    elif out.tokens != out.want_tokens:
        out.error = f"{out.tokens} of {out.want_tokens} tokens"
    else:
        out.done_s = clock()
