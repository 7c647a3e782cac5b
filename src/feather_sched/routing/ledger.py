"""What Feather's router knows of each replica, from what it routed there and saw finish.

Per replica: its queue (routed, unfinished), its share of recent routings (decayed over
`window` routings), its prefix groups (level-0 keys it runs), its drain forecast, and its
last `rate_window` arrival times. Per prompt prefix (a CHT key, `(level, digest)`): which
replicas run it, and when one last did (a replica's prefix cache keeps a prefix for a while
after its requests finish: `cache_ttl_s`). And the mean output of finished requests.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from feather_sched.index.cht import deepest_true
from feather_sched.routing.base import RoutingRequest
from feather_sched.routing.forecast import Booking, ReplicaForecast

Key = tuple[int, int]

SWEEP_EVERY = 4096
"""Routings between sweeps of the prefixes no replica runs or caches (bounded memory)."""


@dataclass(slots=True)
class _Hold:
    outstanding: int = 0
    last: float = -math.inf


class ReplicaLedger:
    """The router's per-replica and per-prefix bookkeeping (see the module doc)."""

    def __init__(
        self,
        chunk_tokens: int,
        chars_per_token: int,
        cache_ttl_s: float,
        window: int,
        rate_window: int,
        default_output_tokens: int,
    ) -> None:
        self.chunk_tokens = int(chunk_tokens)
        self.chars_per_token = int(chars_per_token)
        self.cache_ttl_s = float(cache_ttl_s)
        self.rate_window = int(rate_window)
        self.default_output_tokens = float(default_output_tokens)
        self._decay = 1.0 - 1.0 / max(1, window)
        self._out_sum = 0.0
        self._out_n = 0
        self.replicas: dict[str, None] = {}
        self.forecasts: dict[str, ReplicaForecast] = {}
        self.loads: dict[str, int] = {}
        self.shares: dict[str, float] = {}
        self.groups: dict[str, dict[Key, int]] = {}
        self.resident: dict[str, int] = {}
        """Prompt chunks each replica runs or has cached (the ledger's holds): its share of
        the cluster's prefix KV."""
        self._arrivals: dict[str, deque] = {}
        self._holds: dict[Key, dict[str, _Hold]] = {}
        self._routed: dict[str, tuple[str, list[Key], Booking]] = {}
        self._sweep_at = 0

    # ------------------------------------------------------------------ replicas
    def add_replica(self, replica: str) -> None:
        if replica in self.replicas:
            return
        self.replicas[replica] = None
        self.loads[replica] = 0
        # a newcomer starts at the mean share: it is not owed the whole history
        shares = [self.shares[r] for r in self.shares]
        self.shares[replica] = sum(shares) / len(shares) if shares else 0.0
        self.groups[replica] = {}
        self.resident[replica] = 0
        self.forecasts[replica] = ReplicaForecast()
        self._arrivals[replica] = deque(maxlen=self.rate_window)

    def remove_replica(self, replica: str) -> None:
        if replica not in self.replicas:
            return
        del self.replicas[replica]
        for d in (
            self.loads,
            self.shares,
            self.groups,
            self.resident,
            self.forecasts,
            self._arrivals,
        ):
            d.pop(replica, None)
        for key in list(self._holds):
            holders = self._holds[key]
            holders.pop(replica, None)
            if not holders:
                del self._holds[key]
        for rid in [i for i, (r, _, _) in self._routed.items() if r == replica]:
            del self._routed[rid]

    # ------------------------------------------------------------------ reading
    def keys(self, request: RoutingRequest) -> list[Key]:
        """The request's prompt prefixes, `(level, digest)` (cached on the request)."""
        key = ("keys", self.chunk_tokens, self.chars_per_token)
        if key not in request._cache:
            chain = request.chain(self.chunk_tokens, self.chars_per_token)
            request._cache[key] = list(enumerate(chain))
        return request._cache[key]

    def _holds_at(self, key: Key, replica: str, now: float, running: bool) -> bool:
        h = self._holds.get(key, {}).get(replica)
        if h is None:
            return False
        return h.outstanding > 0 or (not running and now - h.last <= self.cache_ttl_s)

    def depth(
        self, request: RoutingRequest, replica: str, now: float, running: bool = False
    ) -> int:
        """Leading chunks of the request's prompt `replica` is running (or, unless
        `running`, has cached)."""
        keys = self.keys(request)
        return deepest_true(len(keys), lambda i: self._holds_at(keys[i], replica, now, running))

    def expected_output(self, request: RoutingRequest) -> float:
        """The mean output of finished requests (capped at the request's `max_tokens`);
        before any, its `max_tokens`, else `default_output_tokens`."""
        if self._out_n:
            mean = self._out_sum / self._out_n
            return min(mean, request.max_tokens) if request.max_tokens else mean
        return float(request.max_tokens or self.default_output_tokens)

    def rate(self, replica: str, now: float) -> float | None:
        """Arrivals per second over `replica`'s last `rate_window` routings; None if fewer,
        or a burst (all at one instant: no rate to speak of)."""
        times = self._arrivals.get(replica)
        if times is None or len(times) < self.rate_window or now <= times[0]:
            return None
        return len(times) / (now - times[0])

    # ------------------------------------------------------------------ bookkeeping
    def routed(self, request: RoutingRequest, replica: str, booking: Booking, now: float) -> None:
        """`request` went to `replica`, adding `booking` to its forecast."""
        self.forecasts[replica].add(booking)
        keys = self.keys(request)
        for key in keys:
            holders = self._holds.setdefault(key, {})
            h = holders.get(replica)
            if h is None:
                h = holders[replica] = _Hold()
                self.resident[replica] += 1
            h.outstanding += 1
            h.last = now
        if keys:
            g = self.groups[replica]
            g[keys[0]] = g.get(keys[0], 0) + 1
        self.loads[replica] += 1
        for r in self.shares:
            self.shares[r] *= self._decay
        self.shares[replica] += 1.0
        self._routed[request.request_id] = (replica, keys, booking)
        self._arrivals[replica].append(now)

    def sweep_if_due(self, now: float) -> None:
        """A routing happened: every `SWEEP_EVERY`, forget the prefixes no replica runs and
        none has cached."""
        self._sweep_at += 1
        if self._sweep_at < SWEEP_EVERY:
            return
        self._sweep_at = 0
        for key in list(self._holds):
            holders = self._holds[key]
            for r in [
                r
                for r, h in holders.items()
                if not h.outstanding and now - h.last > self.cache_ttl_s
            ]:
                del holders[r]
                self.resident[r] -= 1
            if not holders:
                del self._holds[key]

    def cancel(self, request_id: str, now: float) -> bool:
        """Undo `routed`; False if the request is not outstanding."""
        entry = self._routed.get(request_id)
        if entry is None:
            return False
        self.finished(request_id, now)
        if entry[0] in self.shares:
            self.shares[entry[0]] = max(0.0, self.shares[entry[0]] - 1.0)
        return True

    def finished(self, request_id: str, now: float, output_tokens: int | None = None) -> None:
        """A request finished (or failed), with `output_tokens` when the framework says."""
        if output_tokens is not None:
            self._out_sum += output_tokens
            self._out_n += 1
        entry = self._routed.pop(request_id, None)
        if entry is None:
            return
        replica, keys, booking = entry
        if replica in self.forecasts:
            self.forecasts[replica].add(booking, -1)
        for key in keys:
            h = self._holds.get(key, {}).get(replica)
            if h is not None:
                h.outstanding -= 1
                h.last = now
        if keys and replica in self.groups:
            g = self.groups[replica]
            g[keys[0]] -= 1
            if g[keys[0]] <= 0:
                del g[keys[0]]
        if replica in self.loads:
            self.loads[replica] -= 1
