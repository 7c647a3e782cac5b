"""How long a replica needs to serve what it holds: the router's cost model.

A request's cost depends on what the replica already runs: in a group it runs, its suffix's
prefill and one more row reading the group's prefix; elsewhere, the prefix's prefill and
another prefix to read every decode step (`cost.step_model` prices it). `ReplicaForecast`
keeps per replica the counts that price a drain: outstanding requests, prefill still owed,
prompt and expected output tokens, and per prefix group its members and shared tokens.
A drain is the prefill plus `output / batch` decode steps of the replica's batch shape: a
forecast for comparing replicas (queues priced as if they started now), not a simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from feather_sched.cost.step_model import BatchShape, StepCostModel

_PREFILL_PROBE_TOKENS = 2048
"""Prefill tokens in the step that prices one prefill token (a chunked-prefill budget)."""


@dataclass(slots=True)
class Booking:
    """What one routed request adds to its replica's forecast (undone when it finishes)."""

    group: int | tuple | None
    uncached: int
    prompt: int
    output: float
    shared: int
    """Prompt tokens it shares with its group's outstanding members (on that replica, or, for a
    spill, anywhere: the followers it brings will share them)."""


@dataclass(slots=True)
class _Group:
    members: int = 0
    shared: int = 0

    def contribution(self) -> tuple[int, int]:
        """(distinct, logical) prefix KV tokens this group's batch rows share. A lone member
        of a group that runs elsewhere counts too: a spill's followers come after it, and
        its prefix is in the cache's working set from its first step."""
        if self.members >= 1 and self.shared:
            return self.shared, self.members * self.shared
        return 0, 0


@dataclass(slots=True)
class ReplicaForecast:
    """One replica's outstanding work, as counts the step model prices (kept as running
    sums, so pricing costs the same whatever the queue holds)."""

    requests: int = 0
    uncached: int = 0
    """Prompt tokens still to prefill (what the replica's prefix cache will not serve)."""
    prompt: int = 0
    output: float = 0.0
    """Output tokens still to decode (expected, so a float)."""
    shared_unique: int = 0
    """Distinct shared-prefix tokens its groups hold (each prefix counted once)."""
    shared_logical: int = 0
    """The same prefixes counted once per reader: the KV a decode step reads for them."""
    groups: dict = field(default_factory=dict)

    def add(self, b: Booking, sign: int = 1) -> None:
        """Book `b` (sign 1) or release it (sign -1)."""
        self.requests += sign
        self.uncached += sign * b.uncached
        self.prompt += sign * b.prompt
        self.output += sign * b.output
        if b.group is None:
            return
        g = self.groups.setdefault(b.group, _Group())
        self._count(g, -1)
        g.members += sign
        if sign > 0:
            g.shared = _joined_shared(g, b)
        if g.members <= 0:
            del self.groups[b.group]
        else:
            self._count(g, 1)

    def plus(self, b: Booking) -> ReplicaForecast:
        """A copy with `b` booked."""
        f = ReplicaForecast(
            self.requests, self.uncached, self.prompt, self.output,
            self.shared_unique, self.shared_logical,
            {k: _Group(g.members, g.shared) for k, g in self.groups.items()},
        )  # fmt: skip
        f.add(b)
        return f

    @property
    def kv_tokens(self) -> float:
        """KV its outstanding requests hold at their longest: each shared prefix once, the
        rest of every prompt, and every expected output token."""
        return self.prompt - self.shared_logical + self.shared_unique + self.output

    def members_of(self, group) -> int:
        g = self.groups.get(group)
        return g.members if g else 0

    def with_extra(self, b: Booking) -> tuple[int, int]:
        """(distinct, logical) shared prefix tokens if `b` joined."""
        g = self.groups.get(b.group) if b.group is not None else None
        if g is None:
            return self.shared_unique, self.shared_logical
        u0, l0 = g.contribution()
        u1, l1 = _Group(g.members + 1, _joined_shared(g, b)).contribution()
        return self.shared_unique - u0 + u1, self.shared_logical - l0 + l1

    def _count(self, g: _Group, sign: int) -> None:
        u, lg = g.contribution()
        self.shared_unique += sign * u
        self.shared_logical += sign * lg


def _joined_shared(g: _Group, b: Booking) -> int:
    """A group's shared prefix once `b` joins: the shortest any member shares."""
    if not b.shared:
        return g.shared
    return b.shared if g.shared == 0 else min(g.shared, b.shared)


def kv_capacity_tokens(
    cost: StepCostModel, utilization: float = 0.9, reserve: float = 2e9
) -> float:
    """A replica's KV cache in tokens as an engine sizes it from its profile (vLLM's
    `gpu_memory_utilization` of the memory, less the weights and an activation reserve);
    inf when the hardware profile gives no memory."""
    memory = cost.hardware.memory_bytes
    if memory <= 0:
        return math.inf
    free = memory * utilization - cost.model.weight_bytes - reserve
    return max(0.0, free / cost.model.kv_bytes_per_token)


class DrainModel:
    """Prices a `ReplicaForecast` in seconds with the simulator's step model."""

    def __init__(self, cost: StepCostModel, max_num_seqs: int) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.cost = cost
        self.max_num_seqs = int(max_num_seqs)
        probe = BatchShape(
            num_prefill_tokens=_PREFILL_PROBE_TOKENS,
            prefill_attn_pairs=_PREFILL_PROBE_TOKENS * _PREFILL_PROBE_TOKENS // 2,
            num_prefill_seqs=1,
        )
        self.prefill_s_per_token = cost.step_time(probe) / _PREFILL_PROBE_TOKENS

    def drain_s(self, f: ReplicaForecast, extra: Booking | None = None) -> float:
        """Seconds to serve everything `f` holds (plus `extra`, if given)."""
        n = f.requests + (extra is not None)
        if n <= 0:
            return 0.0
        uncached = f.uncached + (extra.uncached if extra else 0)
        prompt = f.prompt + (extra.prompt if extra else 0)
        output = f.output + (extra.output if extra else 0.0)
        shared = (f.shared_unique, f.shared_logical) if extra is None else f.with_extra(extra)
        rows = min(n, self.max_num_seqs)
        step = self._decode_step_s(n, prompt, output, shared, rows)
        return uncached * self.prefill_s_per_token + output / rows * step

    def keeps_up(self, f: ReplicaForecast, rate_per_s: float, prefill_tokens: float) -> bool:
        """Whether a replica whose queue looks like `f` serves `rate_per_s` arrivals, each
        with `prefill_tokens` to compute, as fast as they come. Its batch grows until it
        drains as fast as it fills (Little's law: rows in flight = arrival rate x decode
        steps per request x step time); it keeps up if that batch fits `max_num_seqs`. Each
        step also computes its share of the arrivals' prefill (chunked prefill rides with
        the decode rows, nearly free while the step is memory-bound). Solved by fixed-point
        iteration from one row (the step time only grows with the rows, so the iteration
        climbs to the least fixed point or past the cap)."""
        if f.requests <= 0:
            return True
        output = max(1.0, f.output / f.requests)
        shared = (f.shared_unique, f.shared_logical)
        rows = 1.0
        for _ in range(64):
            r = min(self.max_num_seqs, max(1, math.ceil(rows)))
            prefill = r * prefill_tokens / output  # each request's prefill over its steps
            step = self._decode_step_s(f.requests, f.prompt, f.output, shared, r, prefill)
            needed = rate_per_s * output * step
            if needed > self.max_num_seqs:
                return False
            if needed <= rows + 0.5:
                return True
            rows = needed
        return False

    def _decode_step_s(
        self,
        n: int,
        prompt: float,
        output: float,
        shared: tuple[int, int],
        rows: int,
        prefill_tokens: float = 0.0,
    ) -> float:
        """One decode step of `rows` rows drawn from a queue of `n` requests with these
        totals (the queue's mix of groups, scaled to the rows), plus `prefill_tokens`."""
        shared_unique, shared_logical = shared
        scale = rows / n
        logical = prompt + output / 2  # mean context over the decode
        shape = BatchShape(
            num_decode=rows,
            num_prefill_tokens=int(prefill_tokens),
            logical_kv_tokens=int(scale * logical),
            unique_kv_tokens=int(scale * (logical - shared_logical)) + shared_unique,
            shared_unique_kv_tokens=shared_unique,
            shared_logical_kv_tokens=int(scale * shared_logical),
            shared_span_tokens=logical / n if shared_unique else 0.0,
        )
        return self.cost.step_time(shape)
