"""The HTTP side of `feather replay`: an OpenAI-compatible server checked, then sent a
workload on its arrival schedule, every request streamed and timed.

Prompts go as token ids (`prompt: [ids]`, which vLLM's and SGLang's `/v1/completions` take),
so the prefixes the server sees share exactly what the workload shares; each asks for its
fixed output length (`max_tokens` with `ignore_eos`), with no sampling settings of its own
(the server's defaults, as for `vllm bench serve`). A request is sent at its arrival time
whatever the server is doing (one task per request; `max_concurrency` caps how many are in
flight, as bench_serving's `--max-concurrency`), so a slow server builds a queue instead of
slowing the client down. Every failure is data: an HTTP error, a stream that drops or stalls
(`request_timeout_s` without a byte) or a wrong token count marks that request failed with
its reason; the run goes on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from feather_lab.replay import native as native_api
from feather_lab.replay.transport import post_aiohttp, stream_session
from feather_sched.request import Request


class EndpointError(ValueError):
    """The server cannot be replayed against (unreachable, or not an OpenAI-style API)."""


@dataclass(frozen=True)
class Endpoint:
    url: str
    """The server's base URL, without a trailing slash (`http://host:port`)."""
    model: str
    """The served model's id (`/v1/models`), sent with every request."""
    max_model_len: int | None
    """The context the server reports (vLLM does), else None (nothing checked)."""


@dataclass(frozen=True)
class ClientOptions:
    max_concurrency: int | None = None
    """At most this many requests in flight (None: no cap)."""
    request_timeout_s: float = 300.0
    """A request fails when the server sends nothing for this long (connect or read)."""
    stream_interval: int = 1
    """Ask the server to stream every this many tokens in one chunk (vLLM's per-request
    `stream_interval`, as its `--stream-interval`; the first and last chunks still come at
    once, so TTFT and TPOT are unchanged in meaning, ITL becomes the gap between chunks).
    1: every token its own chunk, and nothing extra is sent (any server)."""
    api: str = "completions"
    """`completions`: the OpenAI `/v1/completions` (vLLM, SGLang); `generate`: SGLang's
    native `/generate` (replay/native.py)."""


APIS = ("completions", "generate")


@dataclass
class Outcome:
    """One request as the client saw it; times are seconds from the run's start."""

    request_id: str
    prompt_tokens: int
    want_tokens: int
    scheduled_s: float
    sent_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)
    """When each streamed chunk carrying tokens arrived."""
    done_s: float | None = None
    """When the stream ended with every requested token (None: failed or unfinished)."""
    tokens: int = 0
    """Output tokens the server reported (its usage), else the text chunks counted."""
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.done_s is not None


def preflight(url: str, timeout_s: float = 10.0) -> Endpoint:
    """The server's model from `GET /v1/models`, before any request is sent; an
    EndpointError names the URL and what is wrong with it."""
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise EndpointError(f"{url!r} is not an http:// or https:// URL")
    try:
        resp = httpx.get(base + "/v1/models", timeout=timeout_s)
    except httpx.HTTPError as err:
        raise EndpointError(f"{base}: unreachable ({type(err).__name__}: {err})") from None
    try:
        models = resp.json()["data"] if resp.status_code == 200 else None
    except (ValueError, KeyError, TypeError):
        models = None
    if not models or not isinstance(models, list) or "id" not in models[0]:
        raise EndpointError(
            f"{base}/v1/models answered HTTP {resp.status_code} without a model list: not an "
            "OpenAI-compatible server (vLLM: `vllm serve`; SGLang: `sglang.launch_server`)"
        )
    length = models[0].get("max_model_len")
    return Endpoint(base, str(models[0]["id"]), int(length) if length else None)


def request_body(endpoint: Endpoint, req: Request, stream_interval: int = 1) -> dict:
    """A streamed completion of exactly `req.output_len` tokens from its token ids, or from
    its text where the workload came as text (`meta["text"]`: the server tokenizes it)."""
    text = req.meta.get("text")
    body = {
        "model": endpoint.model,
        "prompt": req.prompt.tolist() if text is None else text,
        "max_tokens": req.output_len,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if stream_interval > 1:
        body["stream_interval"] = stream_interval
    return body


Take = Callable[[dict, Outcome, Callable[[], float]], None]
"""One API's reading of one streamed event into the request's outcome."""


def take_completion(event: dict, out: Outcome, clock: Callable[[], float]) -> None:
    """An OpenAI completion chunk, read as vLLM's client reads it
    (`async_request_openai_completions`): every chunk with a choice is a token event, its
    text empty or not (a special token's is), the first one the TTFT; the usage gives the
    token counts, the prompt's as the server counted it."""
    if event.get("choices"):
        out.chunk_s.append(clock())
    usage = event.get("usage")
    if usage:
        out.tokens = int(usage.get("completion_tokens", 0))
        out.prompt_tokens = int(usage.get("prompt_tokens") or out.prompt_tokens)


async def read_stream(
    lines: AsyncIterator[str], out: Outcome, clock: Callable[[], float], take: Take
) -> None:
    """The server-sent events of one request, each read by `take`, to the `[DONE]` marker;
    an error event fails it, as do a stream cut short and a wrong token count (the
    server's own count, else the chunks')."""
    finished = False
    async for line in lines:
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
        take(event, out, clock)
    out.tokens = out.tokens or len(out.chunk_s)
    if not finished:
        out.error = f"stream ended without [DONE] after {len(out.chunk_s)} chunks"
    elif out.tokens != out.want_tokens:
        out.error = f"{out.tokens} of {out.want_tokens} tokens"
    else:
        out.done_s = clock()


async def send_one(
    client: httpx.AsyncClient | Any,
    endpoint: Endpoint,
    req: Request,
    out: Outcome,
    clock: Callable[[], float],
    options: ClientOptions,
) -> None:
    """One request, streamed (`client`: an httpx client or an aiohttp session, transport.py);
    whatever goes wrong is recorded in `out`, never raised."""
    out.sent_s = clock()
    if options.api == "generate":
        url = endpoint.url + native_api.PATH
        body = native_api.generate_body(req, options.stream_interval)
        take = native_api.take_generate
    else:
        url = endpoint.url + "/v1/completions"
        body = request_body(endpoint, req, options.stream_interval)
        take = take_completion
    if not isinstance(client, httpx.AsyncClient):
        await post_aiohttp(
            client, url, body, out, lambda lines: read_stream(lines, out, clock, take)
        )
        return
    try:
        async with client.stream("POST", url, json=body) as resp:
            out.status = resp.status_code
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                out.error = f"HTTP {resp.status_code}: {text[:200]}"
                return
            await read_stream(resp.aiter_lines(), out, clock, take)
    except httpx.TimeoutException:
        out.error = f"timeout: no data after {len(out.chunk_s)} chunks"
    except (httpx.HTTPError, json.JSONDecodeError) as err:
        out.error = f"{type(err).__name__} after {len(out.chunk_s)} chunks: {err}"


async def run_schedule(
    endpoint: Endpoint,
    requests: Sequence[Request],
    options: ClientOptions,
    outcomes: list[Outcome],
    during: Callable[[httpx.AsyncClient], Awaitable[None]] | None = None,
) -> float:
    """Every request sent at its arrival time (from the first one's); returns the run's
    start on `time.perf_counter`. `outcomes` fills as requests are sent, so a caller
    interrupted mid-run keeps what finished. A later turn (`meta["depends_on"]`) waits for
    its parent's answer. `during(client)` runs beside the schedule (the metrics sampler)
    and is cancelled when the last request ends."""
    cap = asyncio.Semaphore(options.max_concurrency) if options.max_concurrency else None
    answered: dict[str, asyncio.Event] = {r.request_id: asyncio.Event() for r in requests}
    t_first = min((r.arrival_time for r in requests), default=0.0)
    timeout = httpx.Timeout(options.request_timeout_s)
    limits = httpx.Limits(max_connections=options.max_concurrency, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(timeout=timeout, limits=limits) as client,
        stream_session(options.max_concurrency, options.request_timeout_s) as session,
    ):
        streams = client if session is None else session
        # the clock starts once the client is built (its TLS context takes 0.1-0.5 s on a
        # loaded machine), so that time is not counted as every request's send lag
        start = time.perf_counter()

        def clock() -> float:
            return time.perf_counter() - start

        side = asyncio.create_task(during(client)) if during is not None else None

        async def one(req: Request, out: Outcome) -> None:
            parent = req.meta.get("depends_on")
            if parent in answered:
                await answered[parent].wait()
            try:
                if cap is None:
                    await send_one(streams, endpoint, req, out, clock, options)
                else:
                    async with cap:
                        await send_one(streams, endpoint, req, out, clock, options)
            finally:
                answered[req.request_id].set()

        tasks = []
        for req in sorted(requests, key=lambda r: r.arrival_time):
            at = req.arrival_time - t_first
            if at > clock():
                await asyncio.sleep(at - clock())
            out = Outcome(req.request_id, req.prompt_len, req.output_len, at)
            outcomes.append(out)
            tasks.append(asyncio.create_task(one(req, out)))
        try:
            await asyncio.gather(*tasks)
        finally:
            if side is not None:
                side.cancel()
                await asyncio.gather(side, return_exceptions=True)
    return start
