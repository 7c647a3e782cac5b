"""CPU a streaming client spends per server-sent event: httpx against aiohttp.

`feather replay` reads every token of every request as one event; a client on the server's
machine takes that CPU from the server. This serves `--streams` concurrent requests of
`--events` OpenAI-style chunks each from a local stdlib server in a child process (so its
CPU is not counted), reads them with replay's own code over each library (`send_one` with an
httpx client, then with an aiohttp session, replay/transport.py), interleaved, and reports
this process's CPU per event (medians of `--repeats`).
Usage: PYTHONPATH=src python benchmarks/replay/client_cpu.py [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np

from feather_lab.bench.record import guard, write_record
from feather_lab.replay.client import ClientOptions, Endpoint, Outcome, send_one
from feather_lab.replay.transport import stream_session
from feather_sched.request import Request


def serve(port_out, events: int) -> None:
    """A server streaming `events` completion chunks, usage and [DONE] per request."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunks = [{"choices": [{"index": 0, "text": f" t{i}"}]} for i in range(events)]
            chunks.append(
                {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": events}}
            )
            for payload in [*map(json.dumps, chunks), "[DONE]"]:
                raw = f"data: {payload}\n\n".encode()
                self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")

    class Server(ThreadingHTTPServer):
        request_queue_size = 512  # every stream connects at once
        daemon_threads = True

    httpd = Server(("127.0.0.1", 0), Handler)
    port_out.put(httpd.server_address[1])
    httpd.serve_forever()


async def read_all(url: str, streams: int, events: int, library: str) -> list[Outcome]:
    endpoint, options = Endpoint(url, "m", None), ClientOptions()
    reqs = [Request(f"r{i}", np.array([5, 6, 7, 8]), events) for i in range(streams)]
    outs = [Outcome(r.request_id, 4, events, 0.0) for r in reqs]
    start = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - start

    async with httpx.AsyncClient(timeout=60) as client, stream_session(None, 60) as session:
        reader = client if library == "httpx" else session
        await asyncio.gather(
            *(send_one(reader, endpoint, r, o, clock, options) for r, o in zip(reqs, outs))
        )
    return outs


def cpu_per_event_us(url: str, streams: int, events: int, library: str) -> float:
    t0 = time.process_time()
    outs = asyncio.run(read_all(url, streams, events, library))
    bad = [o.error for o in outs if not o.ok]
    if bad:
        raise RuntimeError(f"{library}: {len(bad)} requests failed, first: {bad[0]}")
    return (time.process_time() - t0) / (streams * events) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--events", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    a = parser.parse_args()
    ports: multiprocessing.Queue = multiprocessing.Queue()
    server = multiprocessing.Process(target=serve, args=(ports, a.events), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{ports.get(timeout=30)}"
    got: dict[str, list[float]] = {"httpx": [], "aiohttp": []}
    try:
        for _ in range(a.repeats):  # interleaved: the machine's load hits both alike
            for library in got:
                got[library].append(cpu_per_event_us(url, a.streams, a.events, library))
    finally:
        server.terminate()
        server.join()
    med = {k: statistics.median(v) for k, v in got.items()}
    for k, v in got.items():
        print(
            f"{k:8} {med[k]:6.1f} us CPU per event "
            f"(median of {a.repeats}: {min(v):.1f}-{max(v):.1f})"
        )
    if a.json:
        write_record(a.json, config=vars(a), cpu_us_per_event=got, median_us=med)


if __name__ == "__main__":
    guard()
    main()
