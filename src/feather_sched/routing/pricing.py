"""What placing a request on a replica costs, by the drain forecast (`routing.forecast`).

A request's booking on a replica is its uncached prompt there, its group, and the prompt it
shares with the group's running rows; the drain model prices the replica's queue with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from feather_sched.routing.base import RoutingRequest
from feather_sched.routing.forecast import Booking, DrainModel
from feather_sched.routing.ledger import ReplicaLedger


class PlacementPricer:
    """Prices placements for Feather's router: drains, who keeps up with its arrivals."""

    def __init__(
        self, drain: DrainModel, ledger: ReplicaLedger, kv_tokens: float = math.inf
    ) -> None:
        self.drain = drain
        self.ledger = ledger
        self.kv_tokens = kv_tokens
        """A replica's KV cache in tokens (inf: unknown, every replica holds anything)."""

    def fits(self, request: RoutingRequest, replica: str, now: float) -> bool:
        """Whether `replica` has KV free for `request`'s whole life: its outstanding
        requests at their longest, plus this prompt less what it already runs of it, plus
        its expected output."""
        if math.isinf(self.kv_tokens):
            return True
        ledger = self.ledger
        prompt = request.length
        if request.tokens is None:
            prompt = -(-prompt // ledger.chars_per_token)
        running = min(prompt, ledger.depth(request, replica, now, True) * ledger.chunk_tokens)
        need = prompt - running + ledger.expected_output(request)
        f = ledger.forecasts.get(replica)
        return (f.kv_tokens if f else 0.0) + need <= self.kv_tokens

    def running_depth(self, request: RoutingRequest, now: float) -> int:
        """Leading chunks of the request's prompt that some replica is running."""
        ledger = self.ledger
        return max((ledger.depth(request, r, now, True) for r in ledger.forecasts), default=0)

    def booking(
        self, request: RoutingRequest, replica: str, now: float, running: int | None = None
    ) -> Booking:
        """What `request` would add to `replica`'s drain forecast: its uncached prompt
        tokens there, its group, the prompt tokens it shares with the group's rows (there,
        or anywhere: `running`, the `running_depth`, the same for every replica of one
        decision, so a caller pricing several replicas passes it once)."""
        ledger = self.ledger
        keys = ledger.keys(request)
        prompt = request.length
        if request.tokens is None:
            prompt = -(-prompt // ledger.chars_per_token)
        cached = min(prompt, ledger.depth(request, replica, now) * ledger.chunk_tokens)
        if running is None:
            running = self.running_depth(request, now)
        shared = min(prompt, running * ledger.chunk_tokens)
        out = ledger.expected_output(request)
        return Booking(keys[0] if keys else None, max(1, prompt - cached), prompt, out, shared)

    def cheapest(
        self,
        request: RoutingRequest,
        options: Sequence[str],
        now: float,
        running: int | None = None,
    ) -> str:
        """The option the drain forecast prices lowest (the first on a tie): the drain after
        taking the request plus the work it adds over the replica count (a new home adds
        the prefix's prefill and a group to that replica's batches, which the cluster does
        not pay if a holder takes it)."""
        forecasts = self.ledger.forecasts
        n = len(forecasts) or 1
        if running is None:
            running = self.running_depth(request, now)
        best, best_price = options[0], math.inf
        for r in options:
            f = forecasts[r]
            before = self.drain.drain_s(f)
            after = self.drain.drain_s(f, self.booking(request, r, now, running))
            price = after + (after - before) / n
            if price < best_price:
                best, best_price = r, price
        return best

    def finish_s(self, request: RoutingRequest, replica: str, now: float, running: int) -> float:
        """When `request` would finish on `replica`: the drain of its queue with it."""
        booking = self.booking(request, replica, now, running)
        return self.drain.drain_s(self.ledger.forecasts[replica], booking)

    def first_token_s(
        self, request: RoutingRequest, replica: str, now: float, running: int
    ) -> float:
        """When `request`'s first token would come on `replica`: the prefill it queues behind
        there (every outstanding request's uncached prompt) plus its own."""
        booking = self.booking(request, replica, now, running)
        f = self.ledger.forecasts[replica]
        return (f.uncached + booking.uncached) * self.drain.prefill_s_per_token

    def sooner_elsewhere(
        self, request: RoutingRequest, holder: str, target: str, now: float
    ) -> bool:
        """Whether `target` (not holding the request's prefix) both finishes `request` sooner
        than `holder` by the drain forecast and gives its first token no later: a second
        home that shortens the group's drain without a longer wait for anyone it takes."""
        running = self.running_depth(request, now)
        if self.finish_s(request, target, now, running) >= self.finish_s(
            request, holder, now, running
        ):
            return False
        return self.first_token_s(request, target, now, running) <= self.first_token_s(
            request, holder, now, running
        )

    def _prefill(self, booking: Booking) -> float:
        """A booking's uncached tokens, less the half chunk a chunk-granular match misses on
        average."""
        return max(1.0, booking.uncached - self.ledger.chunk_tokens / 2)

    def keeps_up(self, request: RoutingRequest, replica: str, now: float) -> bool:
        """Whether `replica` serves its arrivals as they come (`DrainModel.keeps_up`), at
        the rate its last `rate_window` routed requests arrived."""
        rate = self.ledger.rate(replica, now)
        if rate is None:
            return False  # too few arrivals to tell, or a burst: the bound decides
        prefill = self._prefill(self.booking(request, replica, now))
        return self.drain.keeps_up(self.ledger.forecasts[replica], rate, prefill)

    def takes_over(self, request: RoutingRequest, holder: str, target: str, now: float) -> bool:
        """Whether busy `target` keeps up once it is a second home to `request`'s group
        (half the group's arrivals at the holder, on top of its own), its prefix in
        `target`'s cache beside the others. Unknown rates: no (the group stays whole)."""
        ledger = self.ledger
        rate_h, rate_t = ledger.rate(holder, now), ledger.rate(target, now)
        if rate_h is None or rate_t is None:
            return False
        running = self.running_depth(request, now)
        booking = self.booking(request, target, now, running)
        f_h = ledger.forecasts[holder]
        group_rate = rate_h * f_h.members_of(booking.group) / max(1, f_h.requests)
        prefill = self._prefill(self.booking(request, holder, now, running))
        target_fc = ledger.forecasts[target].plus(booking)
        return self.drain.keeps_up(target_fc, rate_t + group_rate / 2, prefill)
