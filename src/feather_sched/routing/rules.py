"""Cluster routing rules: which replica serves a request.

A rule holds a router's state and answers `rank(request, candidates, loads, now)` with ranked
tiers of replica ids, as Ray Serve's `RequestRouter.choose_replicas` returns; the simulator's
cluster mode and the Ray Serve router drive the same rule objects. `Pow2Rule`: Ray Serve's
default (two replicas drawn, the shorter queue wins). `PrefixAffinityRule`: Ray Serve LLM's
`PrefixCacheAffinityRouter` (ray 2.60.0): the replicas owning the prompt's longest match when
its rate reaches `match_rate_threshold`, else the fewest characters. `FeatherRule`: Feather's.
"""

from __future__ import annotations

import random

from feather_sched.routing.base import (  # noqa: F401 (re-exported for the rules' callers)
    RoutingRequest,
    RoutingRule,
    Tiers,
    pick,
    pow2_choice,
)
from feather_sched.routing.feather_rule import FeatherRule, feather_rule
from feather_sched.routing.prefix_tree import PrefixTree


class Pow2Rule(RoutingRule):
    """Ray Serve's default: two distinct replicas uniformly at random, in random order
    (`PowerOfTwoChoicesRequestRouter.choose_replicas`); `pick` takes the shorter queue."""

    name = "pow2"

    def __init__(self, seed: int | None = 0) -> None:
        self._rng = random.Random(seed)

    def rank(self, request, candidates, loads, now) -> Tiers:
        return [pow2_choice(self._rng, candidates)]


class PrefixAffinityRule(RoutingRule):
    """Ray Serve LLM's `PrefixCacheAffinityRouter` decision, step for step (module docstring);
    its tree is `routing.prefix_tree.PrefixTree`, a port of Ray's."""

    name = "prefix-affinity"

    def __init__(
        self,
        imbalanced_threshold: float = float("inf"),
        match_rate_threshold: float = 0.1,
        seed: int | None = 0,
    ) -> None:
        self.imbalanced_threshold = imbalanced_threshold
        self.match_rate_threshold = match_rate_threshold
        self.tree = PrefixTree()
        self._rng = random.Random(seed)

    def add_replica(self, replica, now) -> None:
        self.tree.add_tenants([replica], now)

    def remove_replica(self, replica) -> None:
        self.tree.remove_tenants([replica])

    def rank(self, request, candidates, loads, now) -> Tiers:
        fallback = [pow2_choice(self._rng, candidates)]
        if not candidates:
            return fallback
        text = request.as_text()
        queue = [loads.get(r, 0) for r in candidates]
        if max(queue) - min(queue) > self.imbalanced_threshold:
            return fallback
        matched, tenants = self.tree.prefix_match(text, list(candidates))
        rate = len(matched) / len(text) if text else 0.0
        if rate < self.match_rate_threshold:
            chosen = self.tree.get_smallest_tenants() or []
        else:
            chosen = tenants or []
        chosen = [r for r in chosen if r in set(candidates)]
        return [chosen] if chosen else fallback

    def on_routed(self, request, replica, now) -> None:
        self.tree.insert(request.as_text(), replica, now)


RULES = {"pow2": Pow2Rule, "prefix-affinity": PrefixAffinityRule, "feather": FeatherRule}
"""Routers by name (`feather bench --routers`)."""

REPLICA_POLICY = {"pow2": "fcfs", "prefix-affinity": "fcfs", "feather": "feather"}
"""Each router's replica policy in the cluster bench: Ray's routers over engines' own FCFS
scheduling, Feather's router over Feather's scheduler."""


def make_rule(name: str, seed: int | None = 0, **kwargs) -> RoutingRule:
    try:
        cls = RULES[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; valid: {', '.join(RULES)}") from None
    if cls is FeatherRule:
        return feather_rule(**kwargs)  # deterministic: no seed; profile names -> its cost
    return cls(seed=seed, **kwargs)
