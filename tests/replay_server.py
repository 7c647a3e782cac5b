"""A small OpenAI-style completions server for `feather replay`'s client tests: the real
HTTP stack (stdlib `http.server`, one thread per connection, chunked server-sent events as
vLLM streams them), with faults on demand. The first prompt token picks a request's fate:

- `REJECT`: HTTP 503 with an error body;
- `DROP`: two tokens, then the connection is cut mid-stream;
- `STALL`: one token, then nothing for `stall_s`;
- anything else: `max_tokens` tokens, `token_delay_s` apart, usage, `[DONE]`; with the
  request's `stream_interval` N, as vLLM streams it: the first token at once, then a chunk
  per N tokens, the last chunk when the last token is made.

It records every request it received (`seen`), and the most in flight at once (`peak`).

`FakeServer(flavor="sglang")` follows SGLang 0.5's documented HTTP format instead (no SGLang
server can run on the test machine): the native `POST /generate` (`input_ids`,
`sampling_params.max_new_tokens`; events of cumulative `text`, `output_ids` and
`meta_info.completion_tokens`, then `[DONE]`), `POST /flush_cache`, and `sglang:` metrics.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REJECT, DROP, STALL = 1, 2, 3


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # a burst of connects is queued, as a real server's
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client closing its idle keep-alive connection is not an error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeServer:
    def __init__(
        self,
        token_delay_s: float = 0.0,
        stall_s: float = 30.0,
        metrics: bool = True,
        models_status: int = 200,
        flavor: str = "vllm",
        vocab: int | None = None,
    ) -> None:
        self.flavor = flavor
        self.vocab = vocab
        """Token ids at or above it are refused with HTTP 400, as vLLM does (None: any)."""
        self.probes: list[dict[str, Any]] = []
        """Requests not streamed (the client's preflight probes), kept apart from `seen`."""
        self.flushes = 0
        self.token_delay_s = token_delay_s
        self.stall_s = stall_s
        self.metrics = metrics
        self.models_status = models_status
        self.seen: list[dict[str, Any]] = []
        self.in_flight = 0
        self.peak = 0
        self.answered = 0
        self.lock = threading.Lock()
        self.httpd = _Server(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def metrics_text(self) -> str:
        with self.lock:
            queries = sum(len(_prompt(s)) for s in self.seen)
            if self.flavor == "sglang":
                return (
                    "# TYPE sglang:prompt_tokens_total counter\n"
                    f'sglang:prompt_tokens_total{{is_streaming="true"}} {float(queries)}\n'
                    f'sglang:cached_tokens_total{{cache_source="device"}} {queries / 4}\n'
                    f'sglang:cached_tokens_total{{cache_source="host"}} {queries / 4}\n'
                    f"sglang:num_requests_total {float(len(self.seen))}\n"
                    f"sglang:num_running_reqs {float(self.in_flight)}\n"
                    "sglang:num_queue_reqs 0.0\n"
                )
            return (
                "# HELP vllm:prefix_cache_queries_total x\n"
                f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {float(queries)}\n'
                f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {queries / 2}\n'
                f'vllm:num_requests_running{{engine="0",model_name="m"}} {float(self.in_flight)}\n'
                'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
            )


def _handler(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: str, kind: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/models" and server.models_status == 200:
                models = {"data": [{"id": "fake", "object": "model", "max_model_len": 4096}]}
                self._send(200, json.dumps(models))
            elif self.path == "/metrics" and server.metrics:
                self._send(200, server.metrics_text(), "text/plain")
            else:
                self._send(server.models_status if self.path == "/v1/models" else 404, "{}")

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            native = server.flavor == "sglang" and self.path == "/generate"
            if native or self.path == "/v1/completions":
                self._generate(json.loads(raw), native)
            elif server.flavor == "sglang" and self.path == "/flush_cache":
                server.flushes += 1
                self._send(200, "Cache flushed.\n", "text/plain")
            else:
                self._send(404, "{}")

        def _generate(self, body: dict[str, Any], native: bool) -> None:
            top = max(_prompt(body), default=0)
            if server.vocab is not None and top >= server.vocab:
                message = f"Token id {top} is out of vocabulary"
                self._send(400, json.dumps({"error": {"message": message, "code": 400}}))
                return
            if not body.get("stream"):
                server.probes.append(body)
                self._send(200, json.dumps({"choices": [{"index": 0, "text": " t0"}]}))
                return
            with server.lock:
                server.seen.append(body)
                server.in_flight += 1
                server.peak = max(server.peak, server.in_flight)
            try:
                _complete(self, server, body, native)
            finally:
                with server.lock:
                    server.in_flight -= 1

        def event(self, payload: Any) -> None:
            data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"
            raw = data.encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()

    return Handler


def _prompt(body: dict[str, Any]) -> list[int]:
    return body["input_ids"] if "input_ids" in body else body["prompt"]


def _complete(h: Any, server: FakeServer, body: dict[str, Any], native: bool) -> None:
    """One streamed completion (OpenAI's or SGLang's native format), or its fault (the
    module docstring)."""
    params = body["sampling_params"] if native else body
    fate = _prompt(body)[0]
    want = int(params["max_new_tokens" if native else "max_tokens"])
    if fate == REJECT:
        h._send(503, json.dumps({"error": {"message": "overloaded", "code": 503}}))
        return
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    every, sent = int(params.get("stream_interval", 1)), 0
    for i in range(want):
        if fate == DROP and i == 2:
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if fate == STALL and i == 1:
            time.sleep(server.stall_s)
            return
        time.sleep(server.token_delay_s)
        if i == 0 or i == want - 1 or i % every == 0:
            h.event(_chunk(sent, i + 1, want, len(_prompt(body)), native))
            sent = i + 1
    if not native:
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": want}
        h.event({"choices": [], "usage": usage})
    h.event("[DONE]")
    h.wfile.write(b"0\r\n\r\n")
    with server.lock:
        server.answered += 1


def _chunk(sent: int, made: int, want: int, prompt: int, native: bool) -> dict[str, Any]:
    """The event for tokens `sent`..`made`: OpenAI's delta text, or SGLang's cumulative
    text and ids with `meta_info`."""
    if not native:
        text = "".join(f" t{i}" for i in range(sent, made))
        return {"choices": [{"index": 0, "text": text, "finish_reason": None}]}
    done = {"type": "length", "length": want} if made == want else None
    meta = {"prompt_tokens": prompt, "completion_tokens": made, "finish_reason": done}
    text = "".join(f" t{i}" for i in range(made))
    return {"text": text, "output_ids": list(range(made)), "meta_info": meta, "index": 0}
