"""Feather's prefix-homogeneity router for Ray Serve (extra `ray`: feather-sched[ray]).

`FeatherRequestRouter` subclasses Ray Serve's `RequestRouter` (ray.serve.request_router, the
public plug-in point; supported: ray 2.60) and delegates every decision to
`feather_sched.routing.rules.FeatherRule`, the rule the simulator's cluster mode runs:

    from ray import serve
    from ray.serve.config import RequestRouterConfig
    from feather_sched.ray.router import FeatherRequestRouter

    @serve.deployment(
        num_replicas=4,
        request_router_config=RequestRouterConfig(
            request_router_class=FeatherRequestRouter,
            request_router_kwargs={"balance": 1.2, "chunk_tokens": 64,
                                   "hardware": "h100", "model": "llama-3.1-8b"},
        ),
    )
    class LLM: ...

(`hardware` and `model` name the step model that prices spills, see `FeatherRule`: a
built-in profile or a fitted profile's path; `routing.feather_rule.feather_rule` turns
them into the rule's cost model.)

What the router reads of a request: the first positional argument (or `request` keyword)
with token ids (`prompt_token_ids` attribute or key, or a `prompt` that is a list of ints),
else its text (`prompt` or `messages`, attribute or key, the way Ray Serve LLM's
`PrefixCacheAffinityRouter` reads it); a request without either is routed by load alone.
Its state (per-replica prefix chains, queue lengths, groups) is updated on
`on_request_routed` and `on_request_completed` (Ray fires the latter exactly once per
dispatched request, also when the replica died), and a replica that leaves
(`update_replicas`, `on_replica_actor_died`) is forgotten.

Each `DeploymentHandle` (each calling process) has its own router and so sees its own
traffic: with one ingress (a proxy or an ingress deployment) that is all of it.

For real engines behind the router, `integrations.ray_vllm.VllmReplica` (a vLLM engine with
`FeatherScheduler`, one per replica); for replicas emulated by the simulator on a CPU,
`harness.ray_emulated.EmulatedEngine` (this module imports nothing of the simulator).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from feather_sched.routing.feather_rule import feather_rule
from feather_sched.routing.rules import FeatherRule, RoutingRequest, pick, pow2_choice

__all__ = ["CompletionRequest", "FeatherRequestRouter", "request_of"]


@dataclass
class CompletionRequest:
    """A minimal completion request (what the tests and the Ray bench send): text and/or
    token ids, and how many tokens to generate. It has `prompt`, as Ray Serve LLM's router
    expects."""

    request_id: str
    prompt: str | list[int]
    max_tokens: int = 16
    prompt_token_ids: list[int] | None = None


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _text_of(value: Any) -> str:
    """Ray Serve LLM's normalization: a string, or message contents concatenated."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text_of(m.get("content") if isinstance(m, dict) else m) for m in value)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return value["text"]
        return _text_of(value.get("content"))
    return ""


def request_of(request_id: str, args: Sequence[Any], kwargs: dict) -> RoutingRequest | None:
    """What the router sees of one call's arguments (module docstring), or None."""
    for arg in (*args, kwargs.get("request")):
        if arg is None:
            continue
        ids = _field(arg, "prompt_token_ids")
        prompt = _field(arg, "prompt")
        if ids is None and isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            ids = prompt
        if ids is not None and len(ids):
            return RoutingRequest(request_id, tokens=np.asarray(ids, dtype=np.int32))
        text = _text_of(prompt) or _text_of(_field(arg, "messages"))
        if not text and isinstance(arg, str):
            text = arg
        if text:
            return RoutingRequest(request_id, text=text)
    return None


class FeatherRequestRouter(RequestRouter):
    """Ray Serve request router running Feather's bounded-load prefix placement with priced
    spills (`routing.rules.FeatherRule`; its options are `request_router_kwargs`)."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._rule = feather_rule(**kwargs)  # `hardware`/`model` names -> its cost model
        self._pending: dict[str, RoutingRequest] = {}
        self._booked: dict[str, str] = {}  # internal request id -> replica booked for it
        self._rng = random.Random()

    # Ray calls initialize_state after __init__; a router used before it (never, in Ray
    # 2.60) still works with the defaults.
    @property
    def rule(self) -> FeatherRule:
        if not hasattr(self, "_rule"):
            self.initialize_state()
        return self._rule

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        old = set(self._replica_id_set)
        super().update_replicas(replicas)
        new = set(self._replica_id_set)
        now = time.time()
        for rid in new - old:
            self.rule.add_replica(rid.to_full_id_str(), now)
        for rid in old - new:
            self.rule.remove_replica(rid.to_full_id_str())

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.rule.remove_replica(replica_id.to_full_id_str())

    def _loads(self, replicas: Sequence[RunningReplica]) -> dict[str, int]:
        """Queue lengths: Ray's cache where fresh, else what this router routed there."""
        out = {}
        for r in replicas:
            key = r.replica_id.to_full_id_str()
            cached = self._replica_queue_len_cache.get(r.replica_id)
            out[key] = max(cached or 0, self.rule.load(key))
        return out

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """Tier 1: the rule's choice alone; tier 2: the other replicas, best first (Ray
        falls back to it when the first is at `max_ongoing_requests`).

        Ray routes many requests concurrently and reports where each went only after the
        replica accepted it (`on_request_routed`), so the router books each decision at once
        (a burst must see its own earlier choices) and moves the booking if Ray sent the
        request elsewhere."""
        by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        ids = list(by_id)
        if not ids:
            return []
        req = None
        if pending_request is not None:
            iid = pending_request.metadata.internal_request_id
            req = self._pending.get(iid)
            if req is None:
                req = request_of(iid, pending_request.args or (), pending_request.kwargs or {})
                if req is not None:
                    self._pending[iid] = req
        if req is None:  # nothing to match on: load alone (pow2, Ray's default)
            return [[by_id[i] for i in pow2_choice(self._rng, ids)]]
        now = time.time()
        booked = self._booked.pop(req.request_id, None)
        if booked is not None:  # a retry (backoff): forget the earlier booking
            self.rule.cancel(req.request_id, now)
        loads = self._loads(candidate_replicas)
        tiers = self.rule.rank(req, ids, loads, now)
        first = pick(tiers, loads)
        if first is None:
            return []
        self.rule.on_routed(req, first, now)
        self._booked[req.request_id] = first
        rest = [i for tier in tiers for i in tier if i != first and i in by_id]
        rest += [i for i in ids if i != first and i not in rest]
        return [[by_id[first]], [by_id[i] for i in rest]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result):
        iid = pending_request.metadata.internal_request_id
        req = self._pending.pop(iid, None)
        where = replica_id.to_full_id_str()
        booked = self._booked.pop(iid, None)
        if booked == where:
            return
        now = time.time()
        if booked is not None:
            self.rule.cancel(iid, now)
        if req is None:
            req = request_of(iid, pending_request.args or (), pending_request.kwargs or {})
        if req is None:
            req = RoutingRequest(iid, tokens=np.zeros(0, np.int32))
        self.rule.on_routed(req, where, now)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._booked.pop(internal_request_id, None)
        self._pending.pop(internal_request_id, None)
        self.rule.on_finished(internal_request_id, replica_id.to_full_id_str(), time.time())
