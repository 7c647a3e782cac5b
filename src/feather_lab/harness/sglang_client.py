"""The tokenizer side of SGLang's scheduler in the loop harness (`sglang_engine`): requests in
as SGLang's own `TokenizedGenerateReqInput` over the scheduler's ZMQ input socket, outputs
back as `BatchTokenIDOutput`, aborts and cache flushes as the HTTP server sends them."""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from feather_lab.harness.sglang_spec import LoopCounters, ServeRequest, ServeSpec


class Client:
    """The tokenizer side of the two ZMQ sockets: sends each run's requests at their
    arrival times (and aborts), collects every output, flushes the cache between runs and
    shuts the scheduler down at the end."""

    def __init__(self, spec: ServeSpec, port_args, probe: LoopCounters) -> None:
        self.spec = spec
        self.port_args = port_args
        self.probe = probe
        self.results: list[dict[str, Any]] = []
        self.error: str | None = None

    def main(self) -> None:
        import zmq
        from sglang.srt.managers.io_struct import ShutdownReq, sock_send

        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.bind(self.port_args.scheduler_input_ipc_name)
        pull = ctx.socket(zmq.PULL)
        pull.bind(self.port_args.tokenizer_ipc_name)
        try:
            for i, run in enumerate(self.spec.runs):
                if i:
                    self._flush(push, pull)
                self.results.append(self._serve(push, pull, run))
        except BaseException:
            self.error = traceback.format_exc()
        finally:
            sock_send(push, ShutdownReq())
            time.sleep(0.2)
            push.close(linger=1000)
            pull.close(linger=0)
            ctx.term()

    def _flush(self, push, pull) -> None:
        from sglang.srt.managers.io_struct import FlushCacheReqInput, sock_recv, sock_send

        for _ in range(100):
            sock_send(push, FlushCacheReqInput())
            while True:
                out = sock_recv(pull)
                if type(out).__name__ == "FlushCacheReqOutput":
                    break
            if out.success:
                return
            time.sleep(0.05)
        raise RuntimeError("the radix cache could not be flushed between runs")

    def _serve(self, push, pull, run: Sequence[ServeRequest]) -> dict[str, Any]:
        """One run: each request sent at its arrival time, every output collected until all
        finished (or the run times out), then what was still in flight."""
        log = _RunLog(sorted(run, key=lambda r: r.arrival_s))
        before = self.probe.mark()
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        deadline = t0 + self.spec.run_timeout_s
        nxt = 0
        while len(log.finished) < len(log.order):
            now = time.perf_counter()
            if now > deadline:
                missing = [r for r in log.by_rid if r not in log.finished][:5]
                raise TimeoutError(f"run timed out; unfinished: {missing}")
            nxt = log.send_due(push, nxt, now - t0)
            wait_ms = 50
            if nxt < len(log.order):
                wait_ms = max(0, min(50, int((t0 + log.order[nxt].arrival_s - now) * 1000)))
            if pull.poll(wait_ms):
                log.receive(push, pull)
        log.late(pull)  # outputs of this run still in flight (a duplicate finish shows here)
        after = self.probe.mark()
        return {
            "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - cpu0,
            "requests": log.requests(t0),
            "loop": {k: after[k] - before[k] for k in after},
        }


@dataclass
class _RunLog:
    """One run's requests (by arrival) and what the client saw of each."""

    order: list[ServeRequest]
    sent: dict[str, float] = field(default_factory=dict)
    first: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, Any] = field(default_factory=dict)
    finish_msgs: Counter[str] = field(default_factory=Counter)
    abort_sent: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.by_rid = {r.rid: r for r in self.order}

    def send_due(self, push, nxt: int, elapsed: float) -> int:
        """Send the requests that have arrived by `elapsed` (and an immediate abort where
        asked); the index of the next one to send."""
        from sglang.srt.managers.io_struct import AbortReq, sock_send

        while nxt < len(self.order) and self.order[nxt].arrival_s <= elapsed:
            r = self.order[nxt]
            sock_send(push, _tokenized(r))
            self.sent[r.rid] = time.perf_counter()
            nxt += 1
            if r.abort_after_tokens == 0:
                sock_send(push, AbortReq(rid=r.rid))
                self.abort_sent.add(r.rid)
        return nxt

    def receive(self, push, pull) -> None:
        """Every output waiting on the socket: tokens, first-token and finish times, and an
        abort sent once a request reaches its `abort_after_tokens`."""
        import zmq
        from sglang.srt.managers.io_struct import sock_recv

        while True:
            try:
                out = sock_recv(pull, zmq.NOBLOCK)
            except zmq.Again:
                return
            t = time.perf_counter()
            if type(out).__name__ == "AbortReq":  # aborted while waiting: no tokens
                if out.rid in self.by_rid:
                    self.finish_msgs[out.rid] += 1
                    self.finished.setdefault(out.rid, t)
                    self.reasons.setdefault(out.rid, out.finished_reason or {"type": "abort"})
            elif type(out).__name__ == "BatchTokenIDOutput":
                for j, rid in enumerate(out.rids):
                    if rid in self.by_rid:
                        self._tokens_out(push, out, j, rid, t)

    def _tokens_out(self, push, out, j: int, rid: str, t: float) -> None:
        from sglang.srt.managers.io_struct import AbortReq, sock_send

        n = int(out.completion_tokens[j])
        self.tokens[rid] = max(self.tokens.get(rid, 0), n)
        if n and rid not in self.first:
            self.first[rid] = t
        reason = out.finished_reasons[j]
        if reason is not None:
            self.finish_msgs[rid] += 1
            self.finished.setdefault(rid, t)
            self.reasons.setdefault(rid, reason)
        limit = self.by_rid[rid].abort_after_tokens
        if limit and n >= limit and rid not in self.abort_sent and reason is None:
            sock_send(push, AbortReq(rid=rid))
            self.abort_sent.add(rid)

    def late(self, pull) -> None:
        """Finish messages still in flight after every request finished (counted, so a
        duplicate finish shows)."""
        from sglang.srt.managers.io_struct import sock_recv

        while pull.poll(100):
            out = sock_recv(pull)
            if type(out).__name__ == "AbortReq" and out.rid in self.by_rid:
                self.finish_msgs[out.rid] += 1
            elif type(out).__name__ == "BatchTokenIDOutput":
                for j, rid in enumerate(out.rids):
                    if rid in self.by_rid and out.finished_reasons[j] is not None:
                        self.finish_msgs[rid] += 1

    def requests(self, t0: float) -> dict[str, dict[str, Any]]:
        return {
            rid: {
                "sent": self.sent[rid] - t0,
                "first": None if rid not in self.first else self.first[rid] - t0,
                "finished": self.finished[rid] - t0,
                "tokens": self.tokens.get(rid, 0),
                "reason": self.reasons[rid],
                "finish_messages": self.finish_msgs[rid],
                "aborted": rid in self.abort_sent,
            }
            for rid in self.by_rid
        }


def _tokenized(r: ServeRequest):
    from array import array

    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    # not ignore_eos: SGLang then reserves every output token up front and never retracts;
    # the stand-in never emits EOS, so each request still runs to max_new_tokens
    params = SamplingParams(max_new_tokens=r.output_len, temperature=0.0)
    params.normalize(None)
    req = TokenizedGenerateReqInput(
        rid=r.rid,
        input_text=None,
        input_ids=array("q", [int(t) for t in r.prompt]),
        mm_inputs=None,
        token_type_ids=None,
        input_embeds=None,
        sampling_params=params,
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=True,
    )
    req.wrap_pickle_fields()
    return req
