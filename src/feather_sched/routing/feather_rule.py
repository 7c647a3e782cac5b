"""Feather's router: concentrate each prefix group on as few replicas as its load needs, and
price the placements (`FeatherRule`; what it knows: `ledger`; its prices: `pricing`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from feather_sched.cost.resolve import cost_options
from feather_sched.cost.step_model import StepCostModel
from feather_sched.routing.base import RoutingRequest, RoutingRule, Tiers
from feather_sched.routing.forecast import Booking, DrainModel, kv_capacity_tokens
from feather_sched.routing.ledger import ReplicaLedger
from feather_sched.routing.pricing import PlacementPricer


class FeatherRule(RoutingRule):
    """Concentrate each prefix group on as few replicas as its load needs; price the
    placements.

    Bounded-load consistent placement. A replica is *eligible* while taking the request keeps
    it within `balance` x the mean (rounded up) plus `slack` requests (default: one per
    replica), of both its queue and its recent share of routings (decayed over `window`
    routings). The slack keeps a multiplicative bound from splitting groups while few
    requests are in flight (mean 1: cap 2); over many requests it vanishes against the mean.
    Among eligible replicas: the ones holding the request's deepest prefix (at least
    `min_match_chunks` chunks), least loaded first; if none holds any of it, the request
    opens a group on the eligible replica with the least prefix KV resident (its share of
    the cluster's prefix work; the bound keeps request counts even).
    Before all of this, a replica without KV free for the request's whole life (its
    outstanding requests at their longest, plus this one: `PlacementPricer.fits`) is no
    option while another has it.

    When a group's holders are all at the bound (`_spill`): an idle replica takes the
    request unless it would finish sooner behind a holder's queue (a cold replica pays the
    whole prefix prefill); else a holder that keeps up with its arrivals keeps it
    (`DrainModel.keeps_up`, by Little's law on the step model), so a group is split for
    capacity, not for a count; else a busy replica becomes a second home only if it would
    keep up with half the group's arrivals on top of its own, and the request goes to the
    cheaper of it and the holder. Without measured rates at the holder (a burst, or too few
    arrivals over `rate_window` routings) the drain forecast decides: the request goes to
    that busy replica if it finishes sooner there, its prefix prefill included, and its
    first token comes no later there than on the holder (`PlacementPricer.sooner_elsewhere`).
    So a few groups arriving at once are split by their drains instead of one replica
    serving two whole groups, but never by stacking a second prefix's prefill in front of a
    request that would not wait for one at its holder.

    Learned online: the group structure and the mean output length of finished requests
    (before any, a request's `max_tokens`, else `default_output_tokens`); the step model is a
    prior. The rule never reads a workload label; with no sharing it is join-the-shortest-
    queue.
    """

    name = "feather"

    DEFAULT_PROFILES: ClassVar[dict[str, str]] = {"hardware": "h100", "model": "llama-3.1-8b"}
    """The step model's profiles when a rule built from options names none
    (`feather_rule`): a rule always prices placements, so it has no "no cost model"."""

    def __init__(
        self,
        cost: StepCostModel,
        balance: float = 1.2,
        chunk_tokens: int = 64,
        chars_per_token: int = 4,
        min_match_chunks: int = 1,
        cache_ttl_s: float = 300.0,
        window: int = 4096,
        slack: int | None = None,
        max_num_seqs: int = 256,
        default_output_tokens: int = 256,
        rate_window: int = 16,
        kv_tokens: float | None = None,
    ) -> None:
        """`cost`: the step model that prices placements (the drain forecast); from profile
        names, `feather_rule(hardware=..., model=...)`. `kv_tokens`: a replica's KV cache in
        tokens (the engine's blocks x block size; None: as an engine sizes it from `cost`'s
        profiles, `kv_capacity_tokens`). The others: the class docstring and
        `ledger.ReplicaLedger`."""
        if balance < 1.0:
            raise ValueError(f"balance must be >= 1, got {balance}")
        self.drain = DrainModel(cost, max_num_seqs)
        self.ledger = ReplicaLedger(
            chunk_tokens, chars_per_token, cache_ttl_s, window, rate_window, default_output_tokens
        )
        kv = kv_capacity_tokens(cost) if kv_tokens is None else float(kv_tokens)
        self.pricer = PlacementPricer(self.drain, self.ledger, kv)
        self.balance = float(balance)
        self.min_match_chunks = int(min_match_chunks)
        self.slack = slack
        self.stats = {"routed": 0, "matched": 0, "new_group": 0, "spilled": 0, "kept": 0}

    # ------------------------------------------------------------------ replicas
    def add_replica(self, replica, now) -> None:
        self.ledger.add_replica(replica)

    def remove_replica(self, replica) -> None:
        self.ledger.remove_replica(replica)

    def load(self, replica: str) -> int:
        return self.ledger.loads.get(replica, 0)

    def groups(self, replica: str) -> int:
        return len(self.ledger.groups.get(replica, ()))

    def depth(
        self, request: RoutingRequest, replica: str, now: float, running: bool = False
    ) -> int:
        """Leading chunks of the request's prompt `replica` is running (or, unless
        `running`, has cached)."""
        return self.ledger.depth(request, replica, now, running)

    def booking(
        self, request: RoutingRequest, replica: str, now: float, running: int | None = None
    ) -> Booking:
        """What `request` would add to `replica`'s drain forecast (`PlacementPricer`)."""
        return self.pricer.booking(request, replica, now, running)

    # ------------------------------------------------------------------ decision
    def _spill(
        self,
        request: RoutingRequest,
        holders: list[str],
        eligible: list[str],
        load: Mapping[str, int],
        now: float,
    ) -> str:
        """Where a request goes when every replica holding its prefix is at the bound."""
        pricer = self.pricer
        holder = min(holders, key=load.__getitem__)
        idle = [r for r in eligible if load[r] == 0]
        if idle:  # free parallelism, unless it would finish sooner behind the holder's queue
            running = pricer.running_depth(request, now)  # once for the three pricings
            target = pricer.cheapest(request, idle, now, running)
            finish_there = pricer.finish_s(request, target, now, running)
            if pricer.finish_s(request, holder, now, running) < finish_there:
                return holder  # late in a burst: a cold replica pays the whole prefix
            return target
        for h in sorted(holders, key=load.__getitem__):
            if pricer.keeps_up(request, h, now):
                return h  # over the bound, but it serves its arrivals: keep the group
        fewest = min(self.groups(r) for r in eligible)
        target = pricer.cheapest(request, [r for r in eligible if self.groups(r) == fewest], now)
        if pricer.takes_over(request, holder, target, now):
            return pricer.cheapest(request, [holder, target], now)
        burst = self.ledger.rate(holder, now) is None  # no rate: the drain forecast decides
        if burst and pricer.sooner_elsewhere(request, holder, target, now):
            return target  # a second home for the group: the holder's queue is the longer wait
        return holder  # a busy replica would not serve the group better

    def _cap_load(self, load: Mapping[str, int]) -> int:
        """The most requests a replica may queue after taking one more (the bound)."""
        n = len(load)
        slack = n if self.slack is None else self.slack
        return math.ceil(self.balance * (sum(load.values()) + 1) / n) + slack

    def _eligible(self, candidates: Sequence[str], loads: Mapping[str, int]) -> list[str]:
        n = len(candidates)
        slack = n if self.slack is None else self.slack
        own_loads, own_shares = self.ledger.loads, self.ledger.shares
        load = {r: max(loads.get(r, 0), own_loads.get(r, 0)) for r in candidates}
        cap_load = self._cap_load(load)
        share = {r: own_shares.get(r, 0.0) for r in candidates}
        cap_share = math.ceil(self.balance * (sum(share.values()) + 1) / n) + slack
        both = [r for r in candidates if load[r] + 1 <= cap_load and share[r] + 1 <= cap_share]
        if both:
            return both
        # the two bounds disagree (a slow replica with a long queue and a small share):
        # the queue bound wins, it is the one latency feels
        return [r for r in candidates if load[r] + 1 <= cap_load] or list(candidates)

    def rank(self, request, candidates, loads, now) -> Tiers:
        replicas = self.ledger.replicas
        cands = [r for r in candidates if r in replicas] or list(candidates)
        for r in cands:
            if r not in replicas:
                self.add_replica(r, now)
        if not cands:
            return []
        # a replica without KV free for the request's life is no option while another has it
        cands = [r for r in cands if self.pricer.fits(request, r, now)] or cands
        eligible = self._eligible(cands, loads)
        own_loads = self.ledger.loads
        load = {r: max(loads.get(r, 0), own_loads.get(r, 0)) for r in cands}
        depth = {r: self.depth(request, r, now) for r in cands}
        best = max(depth[r] for r in eligible)
        if best >= self.min_match_chunks:
            first = sorted(
                (r for r in eligible if depth[r] == best),
                key=lambda r: (load[r], self.groups(r)),
            )
            self.stats["matched"] += 1
        elif max(depth.values()) >= self.min_match_chunks:
            holders = [r for r in cands if depth[r] == max(depth.values())]
            first = [self._spill(request, holders, eligible, load, now)]
            self.stats["spilled" if first[0] not in holders else "kept"] += 1
        else:
            # a new group: the eligible replica with the least prefix KV resident (a group's
            # prefill, cache and decode reads grow with its prefix, which a count of groups
            # does not see: sessions of 10k and 60k tokens are not the same work; the bound
            # keeps the request counts even)
            res = self.ledger.resident
            first = [min(eligible, key=lambda r: (res[r], load[r]))]
            self.stats["new_group"] += 1
        rest = sorted((r for r in cands if r not in first), key=lambda r: (-depth[r], load[r]))
        return [first, rest]

    # ------------------------------------------------------------------ bookkeeping
    def on_routed(self, request, replica, now) -> None:
        if replica not in self.ledger.replicas:
            self.add_replica(replica, now)
        booking = self.booking(request, replica, now)  # before its own keys count
        self.ledger.routed(request, replica, booking, now)
        self.stats["routed"] += 1
        self.ledger.sweep_if_due(now)

    def cancel(self, request_id: str, now: float) -> None:
        """Undo `on_routed` (a booking the router's framework sent elsewhere)."""
        if self.ledger.cancel(request_id, now):
            self.stats["routed"] -= 1

    def on_finished(self, request_id, replica, now, output_tokens=None) -> None:
        self.ledger.finished(request_id, now, output_tokens)


def feather_rule(**options: Any) -> FeatherRule:
    """A `FeatherRule` from options given by name (`make_rule`, Ray Serve's
    `request_router_kwargs`): profile names (`hardware`, `model`, `kernel`; the unnamed
    ones `FeatherRule.DEFAULT_PROFILES`) become its cost model (`cost.resolve.cost_options`);
    a `cost` passes as it is."""
    return FeatherRule(**cost_options(options, **FeatherRule.DEFAULT_PROFILES))
