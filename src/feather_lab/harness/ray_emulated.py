"""`EmulatedEngine`: a Ray Serve deployment body whose engine is the simulator, played out in
wall-clock time (extra `ray`).

For tests and `benchmarks/cluster/ray_cluster.py`: `sim.cluster.ReplicaEngine` stepped in real time
from the cost model, so a CPU machine can serve a Ray Serve app whose replicas behave like
GPU engines, behind `integrations.ray_serve.FeatherRequestRouter` or Ray's own routers. It
lives in the harness, not with the router, because it runs the simulator.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from feather_sched.ray.router import _field, _text_of

__all__ = ["EmulatedEngine", "text_tokens"]


def text_tokens(text: str) -> np.ndarray:
    """A deterministic tokenization for engines emulated from text: 4 UTF-8 bytes a token
    (prefix-preserving at 4-byte boundaries)."""
    raw = text.encode()
    raw += b"\0" * (-len(raw) % 4)
    return np.frombuffer(raw, dtype="<u4").astype(np.int64).astype(np.int32) & 0x7FFFFFFF


class EmulatedEngine:
    """A Ray Serve deployment body: one engine emulated in real time by the simulator.

    Each call is a `CompletionRequest` (or a dict with its fields); it joins a
    `ReplicaEngine` (the simulator's engine, its policy, KV cache and cost model) whose
    steps are played out in wall-clock time (`time_scale` x the modelled step time), and
    returns when the request's last token is "generated": its id, the replica that served
    it, its TTFT and latency in modelled seconds."""

    def __init__(
        self,
        policy: str = "fcfs",
        hardware: str = "h100",
        model: str = "llama-3.1-8b",
        time_scale: float = 1.0,
        engine: dict | None = None,
        policy_options: dict | None = None,
    ) -> None:
        from feather_lab.sim.cluster import ReplicaEngine
        from feather_lab.sim.config import EngineConfig
        from feather_sched.cost.resolve import resolve_cost
        from feather_sched.policies.registry import make_policy

        # A deployment's options arrive as text: names become cost models here and in
        # make_policy (a feather policy's `hardware`/`model` options).
        self.engine = ReplicaEngine(
            make_policy(policy, **(policy_options or {})),
            resolve_cost(hardware, model),
            EngineConfig(**(engine or {})),
        )
        self.engine.open()
        self.time_scale = float(time_scale)
        self._t0 = time.monotonic()
        self._futures: dict[str, asyncio.Future] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.replica = f"replica-{id(self):x}"
        try:
            from ray import serve

            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside a replica (unit use)
            pass

    def _clock(self) -> float:
        return (time.monotonic() - self._t0) / self.time_scale

    async def __call__(self, request: Any) -> dict:
        from feather_sched.request import Request

        rid = _field(request, "request_id")
        ids = _field(request, "prompt_token_ids")
        prompt = _field(request, "prompt")
        if ids is None and isinstance(prompt, list):
            ids = prompt
        tokens = np.asarray(ids, np.int32) if ids is not None else text_tokens(_text_of(prompt))
        out = int(_field(request, "max_tokens") or 16)
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._serve())
        fut = asyncio.get_running_loop().create_future()
        # an internal id: a retried request may come back to this replica
        key = f"{rid}#{len(self.engine._seqs) + len(self._futures)}"
        self._futures[key] = fut
        self.engine.submit(Request(key, tokens, out, arrival_time=self._clock()))
        self._wake.set()  # type: ignore[union-attr]
        rec = await fut
        return {
            "request_id": rid,
            "replica": self.replica,
            "ttft_s": rec.ttft,
            "latency_s": rec.finish - rec.arrival,
            "output_tokens": rec.output_len,
        }

    async def _serve(self) -> None:
        eng = self.engine
        while True:
            if not eng.has_work():
                self._wake.clear()  # type: ignore[union-attr]
                await self._wake.wait()  # type: ignore[union-attr]
                continue
            eng._now = max(eng._now, self._clock())  # real time: never ahead of the wall
            before = eng._now
            done = eng.step()
            await asyncio.sleep(max(0.0, (eng._now - before) * self.time_scale))
            for rec in done:
                fut = self._futures.pop(rec.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(rec)

    def stats(self) -> dict:
        return {
            "replica": self.replica,
            "steps": self.engine._run.step,
            "finished": self.engine.finished_count,
        }
