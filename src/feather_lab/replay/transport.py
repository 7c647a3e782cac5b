"""The library `feather replay` streams its requests with: aiohttp where it is installed (it
comes with vLLM and SGLang, and is what `vllm bench serve` streams with), else httpx.

Why it matters: a client on the server's machine takes CPU the server's API process needs to
stream its answers. Reading 200 streams of 64 events from a local server through replay's own
send path, httpx took over three times aiohttp's CPU per event (docs/replay.md), and beside a
CPU-starved vLLM server the costlier client showed as later, coalesced chunks: a longer TPOT
and a lower throughput than vLLM's client measured on the same server.
The reading is vLLM's (`StreamedResponseHandler`): bytes as they come, cut into lines.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["HTTP_CLIENT", "post_aiohttp", "stream_session"]

HTTP_CLIENT = "aiohttp" if importlib.util.find_spec("aiohttp") is not None else "httpx"
"""The library the requests go through (recorded in each row)."""


@asynccontextmanager
async def stream_session(max_concurrency: int | None, timeout_s: float) -> AsyncIterator[Any]:
    """An aiohttp session shaped as vLLM's client's (one connection per request in flight,
    kept alive), or None where aiohttp is not installed (httpx streams then)."""
    if HTTP_CLIENT != "aiohttp":
        yield None
        return
    import aiohttp

    limit = max_concurrency or 0
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield session


async def _lines(content: Any) -> AsyncIterator[str]:
    """The response body's lines, read as the bytes arrive (no line-length limit)."""
    buf = b""
    async for data in content.iter_any():
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", errors="replace").rstrip("\r")
    if buf:
        yield buf.decode("utf-8", errors="replace")


async def post_aiohttp(
    session: Any,
    url: str,
    body: dict,
    out: Any,
    read: Callable[[AsyncIterator[str]], Awaitable[None]],
) -> None:
    """POST `body` and hand its lines to `read`; what goes wrong is recorded in `out` (the
    same messages as the httpx path), never raised."""
    import aiohttp

    try:
        async with session.post(url, json=body) as resp:
            out.status = resp.status
            if resp.status != 200:
                text = (await resp.read()).decode(errors="replace")
                out.error = f"HTTP {resp.status}: {text[:200]}"
                return
            await read(_lines(resp.content))
    except asyncio.TimeoutError:
        out.error = f"timeout: no data after {len(out.chunk_s)} chunks"
    except (aiohttp.ClientError, json.JSONDecodeError) as err:
        out.error = f"{type(err).__name__} after {len(out.chunk_s)} chunks: {err}"
