"""Feather's router: concentrate each prefix group on as few replicas as its load needs, and
price the placements (`FeatherRule`)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from feather_sched.cost.resolve import cost_options
from feather_sched.cost.step_model import StepCostModel
from feather_sched.index.cht import deepest_true
from feather_sched.routing.base import RoutingRequest, RoutingRule, Tiers
from feather_sched.routing.forecast import Booking, DrainModel, ReplicaForecast


@dataclass(slots=True)
class _Hold:
    outstanding: int = 0
    last: float = -math.inf


class FeatherRule(RoutingRule):
    """Concentrate each prefix group on as few replicas as its load needs; price the
    placements.

    The router keeps the chained chunk digests (the CHT's keys: `(level, digest)` names a
    prompt prefix through chunk `level`) of every request it routed, per replica: how many
    routed-and-unfinished requests hold each key there, and when one last did (a replica's
    prefix cache keeps a prefix for a while after its requests finish: `cache_ttl_s`). A
    replica's prefix groups are the level-0 keys it is running.

    The rule is bounded-load consistent placement. A replica is *eligible* while taking the
    request keeps it within `balance` x the mean (rounded up) plus `slack` requests (default:
    one per replica), of both its queue (outstanding requests) and its recent share of
    routed requests (decayed over `window` routings). The slack is there because a
    multiplicative bound is all but exact while few requests are in flight (mean 1: cap 2),
    which splits groups for no balance gain (a queue a few longer than the mean joins the
    same batches); over many requests it vanishes against the mean. Measured
    (benchmarks/cluster.md): a fixed 2 split document-qa's groups at 8 replicas (0.68x
    prefix-affinity); one per replica does not, and changes nothing at 2 and 4. Among eligible
    replicas: the ones holding the request's deepest prefix (at least `min_match_chunks`
    chunks), least loaded first; if none holds any of it, the request opens a group on an
    eligible replica running the fewest groups (which one: below). A group larger than one
    replica's fair share can spill only when its holders reach the bound (where: below).

    Placement is priced with a drain forecast (`routing.forecast`: the step model prices
    each replica's outstanding requests, their uncached prefill and the prefixes their
    batches share, against the cache). A new group opens on the replica, among those
    running the fewest groups, where the forecast prices it lowest: beside prefixes it fits
    in the cache with, not merely on the shortest queue. When a group's holders are all at
    the bound (`_spill`): an idle replica takes the request (free parallelism) unless the
    request would finish sooner behind a holder's queue (late in a burst a cold replica pays
    the whole prefix prefill for a few requests); else a holder that keeps up with its
    arrivals keeps it (`DrainModel.keeps_up`: the batch its recent arrival rate needs, by
    Little's law on the step model, fits `max_num_seqs`), so a group is split for capacity,
    not for a count, and a group split once is not split again while one of its homes
    keeps up; else a busy replica becomes a second home only if it would keep up with half
    the group's arrivals on top of its own, the group's prefix in its cache beside the
    others. The second home is the replica, among the eligible ones running the fewest
    groups, that the forecast prices lowest (not the shortest queue: a short queue of long
    prefixes drains slowest), and the request goes to the cheaper of it and the holder (the
    drain after taking it plus the work it adds over the replica count). Without measured
    rates (a burst, or too few arrivals yet) a group stays whole. A bound alone split groups
    into pieces that paired up on other replicas, which then set the makespan (8 replicas:
    0.62x Ray's prefix router on long-prefix; 4 replicas, paper-5g on seed 1: 0.50x; now
    1.00x and 1.03x), and each of the three refinements above mended a row that lost to a
    Ray router on another seed (benchmarks/cluster.md, `benchmarks/cluster_grid.py`).

    What is learned online: the group structure (which prefixes exist, how much of the load
    each carries, who holds them) and the mean output length of finished requests (before
    any, a request's `max_tokens`, else `default_output_tokens`); the step model is a prior
    (the simulator's profile by default, a fitted one from `feather calibrate` or
    `feather probe` for a real deployment). `balance` is the unbalance the operator accepts
    before a group is split. The rule never reads a workload label. With no sharing (every
    request its own group), the rule is join-the-shortest-queue, never worse balanced than
    pow2. The arrival rate is each replica's last `rate_window` routings (fewer, or a burst
    at one instant: no rate, and the bound decides). Known gaps: benchmarks/cluster.md.
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
    ) -> None:
        """`cost`: the step model that prices placements (the drain forecast); from profile
        names, `feather_rule(hardware=..., model=...)`. The others: the class docstring."""
        if balance < 1.0:
            raise ValueError(f"balance must be >= 1, got {balance}")
        self.drain = DrainModel(cost, max_num_seqs)
        self.default_output_tokens = float(default_output_tokens)
        self._out_sum = 0.0
        self._out_n = 0
        self._fc: dict[str, ReplicaForecast] = {}
        self.rate_window = int(rate_window)
        self._arrivals: dict[str, deque] = {}
        self.balance = float(balance)
        self.chunk_tokens = int(chunk_tokens)
        self.chars_per_token = int(chars_per_token)
        self.min_match_chunks = int(min_match_chunks)
        self.cache_ttl_s = float(cache_ttl_s)
        self.slack = slack
        self._decay = 1.0 - 1.0 / max(1, window)
        self._replicas: dict[str, None] = {}
        self._holds: dict[tuple[int, int], dict[str, _Hold]] = {}
        self._load: dict[str, int] = {}
        self._share: dict[str, float] = {}
        self._groups: dict[str, dict[tuple[int, int], int]] = {}
        self._routed: dict[str, tuple[str, list[tuple[int, int]], Booking]] = {}
        self._sweep_at = 0
        self.stats = {"routed": 0, "matched": 0, "new_group": 0, "spilled": 0, "kept": 0}

    # ------------------------------------------------------------------ replicas
    def add_replica(self, replica, now) -> None:
        if replica in self._replicas:
            return
        self._replicas[replica] = None
        self._load[replica] = 0
        # a newcomer starts at the mean share: it is not owed the whole history
        shares = [self._share[r] for r in self._share]
        self._share[replica] = sum(shares) / len(shares) if shares else 0.0
        self._groups[replica] = {}
        self._fc[replica] = ReplicaForecast()
        self._arrivals[replica] = deque(maxlen=self.rate_window)

    def remove_replica(self, replica) -> None:
        if replica not in self._replicas:
            return
        del self._replicas[replica]
        for d in (self._load, self._share, self._groups, self._fc, self._arrivals):
            d.pop(replica, None)
        for key in list(self._holds):
            holders = self._holds[key]
            holders.pop(replica, None)
            if not holders:
                del self._holds[key]
        for rid in [i for i, (r, _, _) in self._routed.items() if r == replica]:
            del self._routed[rid]

    def load(self, replica: str) -> int:
        return self._load.get(replica, 0)

    def groups(self, replica: str) -> int:
        return len(self._groups.get(replica, ()))

    # ------------------------------------------------------------------ decision
    def _keys(self, request: RoutingRequest) -> list[tuple[int, int]]:
        key = ("keys", self.chunk_tokens, self.chars_per_token)
        if key not in request._cache:
            chain = request.chain(self.chunk_tokens, self.chars_per_token)
            request._cache[key] = list(enumerate(chain))
        return request._cache[key]

    def _holds_at(self, key, replica: str, now: float, running: bool) -> bool:
        h = self._holds.get(key, {}).get(replica)
        if h is None:
            return False
        return h.outstanding > 0 or (not running and now - h.last <= self.cache_ttl_s)

    def depth(
        self, request: RoutingRequest, replica: str, now: float, running: bool = False
    ) -> int:
        """Leading chunks of the request's prompt `replica` is running (or, unless
        `running`, has cached)."""
        keys = self._keys(request)
        return deepest_true(len(keys), lambda i: self._holds_at(keys[i], replica, now, running))

    def _expected_output(self, request: RoutingRequest) -> float:
        if self._out_n:
            mean = self._out_sum / self._out_n
            return min(mean, request.max_tokens) if request.max_tokens else mean
        return float(request.max_tokens or self.default_output_tokens)

    def _running_depth(self, request: RoutingRequest, now: float) -> int:
        """Leading chunks of the request's prompt that some replica is running."""
        return max((self.depth(request, r, now, True) for r in self._fc), default=0)

    def booking(
        self, request: RoutingRequest, replica: str, now: float, running: int | None = None
    ) -> Booking:
        """What `request` would add to `replica`'s drain forecast: its uncached prompt
        tokens there, its group, the prompt tokens it shares with the group's rows (there,
        or anywhere: `running`, the `_running_depth`, the same for every replica of one
        decision, so a caller pricing several replicas passes it once)."""
        keys = self._keys(request)
        prompt = request.length
        if request.tokens is None:
            prompt = -(-prompt // self.chars_per_token)
        cached = min(prompt, self.depth(request, replica, now) * self.chunk_tokens)
        if running is None:
            running = self._running_depth(request, now)
        shared = min(prompt, running * self.chunk_tokens)
        out = self._expected_output(request)
        return Booking(keys[0] if keys else None, max(1, prompt - cached), prompt, out, shared)

    def _cheapest(
        self, request, options: Sequence[str], now: float, running: int | None = None
    ) -> str:
        """The option the drain forecast prices lowest (the first on a tie): the drain after
        taking the request plus the work it adds over the replica count (a new home adds
        the prefix's prefill and a group to that replica's batches, which the cluster does
        not pay if a holder takes it)."""
        n = len(self._fc) or 1
        if running is None:
            running = self._running_depth(request, now)
        best, best_price = options[0], math.inf
        for r in options:
            f = self._fc[r]
            before = self.drain.drain_s(f)
            after = self.drain.drain_s(f, self.booking(request, r, now, running))
            price = after + (after - before) / n
            if price < best_price:
                best, best_price = r, price
        return best

    def _finish_s(self, request: RoutingRequest, replica: str, now: float, running: int) -> float:
        """When `request` would finish on `replica`: the drain of its queue with it."""
        booking = self.booking(request, replica, now, running)
        return self.drain.drain_s(self._fc[replica], booking)

    def _keeps_up(self, request: RoutingRequest, replica: str, now: float) -> bool:
        """Whether `replica` serves its arrivals as they come (`DrainModel.keeps_up`), at
        the rate its last `rate_window` routed requests arrived."""
        rate = self._rate(replica, now)
        if rate is None:
            return False  # too few arrivals to tell, or a burst: the bound decides
        # its uncached tokens, less the half chunk a chunk-granular match misses on average
        prefill = max(1.0, self.booking(request, replica, now).uncached - self.chunk_tokens / 2)
        return self.drain.keeps_up(self._fc[replica], rate, prefill)

    def _rate(self, replica: str, now: float) -> float | None:
        """Arrivals per second over `replica`'s last `rate_window` routings; None if fewer,
        or a burst (all at one instant: no rate to speak of)."""
        times = self._arrivals.get(replica)
        if times is None or len(times) < self.rate_window or now <= times[0]:
            return None
        return len(times) / (now - times[0])

    def _takes_over(self, request: RoutingRequest, holder: str, target: str, now: float) -> bool:
        """Whether busy `target` keeps up once it is a second home to `request`'s group
        (half the group's arrivals at the holder, on top of its own), its prefix in
        `target`'s cache beside the others. Unknown rates: no (the group stays whole)."""
        rate_h, rate_t = self._rate(holder, now), self._rate(target, now)
        if rate_h is None or rate_t is None:
            return False
        running = self._running_depth(request, now)
        booking = self.booking(request, target, now, running)
        f_h = self._fc[holder]
        group_rate = rate_h * f_h.members_of(booking.group) / max(1, f_h.requests)
        at_holder = self.booking(request, holder, now, running)
        prefill = max(1.0, at_holder.uncached - self.chunk_tokens / 2)
        return self.drain.keeps_up(self._fc[target].plus(booking), rate_t + group_rate / 2, prefill)

    def _spill(
        self,
        request: RoutingRequest,
        holders: list[str],
        eligible: list[str],
        load: Mapping[str, int],
        now: float,
    ) -> str:
        """Where a request goes when every replica holding its prefix is at the bound."""
        holder = min(holders, key=load.__getitem__)
        idle = [r for r in eligible if load[r] == 0]
        if idle:  # free parallelism, unless it would finish sooner behind the holder's queue
            running = self._running_depth(request, now)  # once for the three pricings
            target = self._cheapest(request, idle, now, running)
            finish_there = self._finish_s(request, target, now, running)
            if self._finish_s(request, holder, now, running) < finish_there:
                return holder  # late in a burst: a cold replica pays the whole prefix
            return target
        for h in sorted(holders, key=load.__getitem__):
            if self._keeps_up(request, h, now):
                return h  # over the bound, but it serves its arrivals: keep the group
        fewest = min(self.groups(r) for r in eligible)
        target = self._cheapest(request, [r for r in eligible if self.groups(r) == fewest], now)
        if self._takes_over(request, holder, target, now):
            return self._cheapest(request, [holder, target], now)
        return holder  # a busy replica would not serve the group better

    def _eligible(self, candidates: Sequence[str], loads: Mapping[str, int]) -> list[str]:
        n = len(candidates)
        slack = n if self.slack is None else self.slack
        load = {r: max(loads.get(r, 0), self._load.get(r, 0)) for r in candidates}
        cap_load = math.ceil(self.balance * (sum(load.values()) + 1) / n) + slack
        share = {r: self._share.get(r, 0.0) for r in candidates}
        cap_share = math.ceil(self.balance * (sum(share.values()) + 1) / n) + slack
        both = [r for r in candidates if load[r] + 1 <= cap_load and share[r] + 1 <= cap_share]
        if both:
            return both
        # the two bounds disagree (a slow replica with a long queue and a small share):
        # the queue bound wins, it is the one latency feels
        return [r for r in candidates if load[r] + 1 <= cap_load] or list(candidates)

    def rank(self, request, candidates, loads, now) -> Tiers:
        cands = [r for r in candidates if r in self._replicas] or list(candidates)
        for r in cands:
            if r not in self._replicas:
                self.add_replica(r, now)
        if not cands:
            return []
        eligible = self._eligible(cands, loads)
        load = {r: max(loads.get(r, 0), self._load.get(r, 0)) for r in cands}
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
            fewest = min(self.groups(r) for r in eligible)
            opening = sorted((r for r in eligible if self.groups(r) == fewest), key=load.get)
            first = [self._cheapest(request, opening, now)]
            self.stats["new_group"] += 1
        rest = sorted((r for r in cands if r not in first), key=lambda r: (-depth[r], load[r]))
        return [first, rest]

    # ------------------------------------------------------------------ bookkeeping
    def on_routed(self, request, replica, now) -> None:
        if replica not in self._replicas:
            self.add_replica(replica, now)
        booking = self.booking(request, replica, now)  # before its own keys count
        self._fc[replica].add(booking)
        keys = self._keys(request)
        for key in keys:
            h = self._holds.setdefault(key, {}).setdefault(replica, _Hold())
            h.outstanding += 1
            h.last = now
        if keys:
            g = self._groups[replica]
            g[keys[0]] = g.get(keys[0], 0) + 1
        self._load[replica] += 1
        for r in self._share:
            self._share[r] *= self._decay
        self._share[replica] += 1.0
        self._routed[request.request_id] = (replica, keys, booking)
        self._arrivals[replica].append(now)
        self.stats["routed"] += 1
        self._sweep_at += 1
        if self._sweep_at >= 4096:
            self._sweep(now)

    def cancel(self, request_id: str, now: float) -> None:
        """Undo `on_routed` (a booking the router's framework sent elsewhere)."""
        entry = self._routed.get(request_id)
        if entry is None:
            return
        self.on_finished(request_id, entry[0], now)
        if entry[0] in self._share:
            self._share[entry[0]] = max(0.0, self._share[entry[0]] - 1.0)
        self.stats["routed"] -= 1

    def on_finished(self, request_id, replica, now, output_tokens=None) -> None:
        if output_tokens is not None:
            self._out_sum += output_tokens
            self._out_n += 1
        entry = self._routed.pop(request_id, None)
        if entry is None:
            return
        replica, keys, booking = entry
        if replica in self._fc:
            self._fc[replica].add(booking, -1)
        for key in keys:
            h = self._holds.get(key, {}).get(replica)
            if h is not None:
                h.outstanding -= 1
                h.last = now
        if keys and replica in self._groups:
            g = self._groups[replica]
            g[keys[0]] -= 1
            if g[keys[0]] <= 0:
                del g[keys[0]]
        if replica in self._load:
            self._load[replica] -= 1

    def _sweep(self, now: float) -> None:
        """Forget prefixes no replica runs and none has cached (bounded memory)."""
        self._sweep_at = 0
        for key in list(self._holds):
            holders = self._holds[key]
            for r in [
                r
                for r, h in holders.items()
                if not h.outstanding and now - h.last > self.cache_ttl_s
            ]:
                del holders[r]
            if not holders:
                del self._holds[key]


def feather_rule(**options: Any) -> FeatherRule:
    """A `FeatherRule` from options given by name (`make_rule`, Ray Serve's
    `request_router_kwargs`): profile names (`hardware`, `model`, `kernel`; the unnamed
    ones `FeatherRule.DEFAULT_PROFILES`) become its cost model (`cost.resolve.cost_options`);
    a `cost` passes as it is."""
    return FeatherRule(**cost_options(options, **FeatherRule.DEFAULT_PROFILES))
