"""Multi-replica simulation: N engines behind a router, on one clock.

Each replica is a simulator engine (`ReplicaEngine`) driven one step at a time. The next
event is an arrival (a `routing.rules` rule picks the replica, seeing what Ray Serve's router
sees: each replica's unfinished requests) or the step of the replica whose clock is earliest.
A conversation's later turn is routed when its parent finishes, at max(its arrival, the
parent's finish). Not modelled: Ray's `max_ongoing_requests` back-pressure (the engines'
queues hold the excess) and network or routing latency.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import SimulationError, Simulator
from feather_lab.sim.result import SLO, RequestRecord, SimResult, latency_summary
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.base import Policy
from feather_sched.request import Request
from feather_sched.routing.rules import RoutingRequest, RoutingRule, pick


class ReplicaEngine(Simulator):
    """A simulator engine that takes its requests one at a time and runs one step per call.

    Its step is `Simulator.step`, the body of `Simulator.run`'s loop, so a replica decides
    exactly as a single engine does; a one-replica cluster reproduces `simulate` exactly
    (tests/test_cluster.py checks it)."""

    def open(self) -> None:
        """An empty run; requests arrive through `submit`."""
        self.begin([])

    def submit(self, req: Request) -> None:
        """`req` reaches this replica at `req.arrival_time` (its queue, from then on)."""
        run = self._run
        if not self.has_work():
            self._now = max(self._now, req.arrival_time)
        run.pending.append(req)
        run.total += 1

    def has_work(self) -> bool:
        run = self._run
        return bool(self._running or self._waiting or run.cursor < len(run.pending))

    @property
    def finished_count(self) -> int:
        return self._run.finished


@dataclass
class ClusterResult:
    router: str
    policy: str
    records: list[RequestRecord]
    """Every finished request, on whichever replica (a killed replica's before it died)."""
    step_groups: np.ndarray
    """Prefix groups in each step's batch, every replica's steps together."""
    step_batch: np.ndarray
    assigned: list[int]
    """Requests routed to each replica that stayed up."""
    replicas: list[SimResult]
    """The replicas that stayed up, each closed and checked like a single engine run."""
    router_cpu_s: float
    wall_s: float
    router_stats: dict = field(default_factory=dict)

    @property
    def makespan_s(self) -> float:
        """First arrival to last finish, over every replica."""
        recs = self.records
        return (max(r.finish for r in recs) - min(r.arrival for r in recs)) if recs else 0.0

    def summary(self, slo: SLO | None = None) -> dict:
        """One `feather bench --replicas` row: the single engine's names and latency fields
        (`SimResult.summary`), plus the router's."""
        recs, span = self.records, self.makespan_s
        out = sum(r.output_len for r in recs)
        groups, batch = self.step_groups, self.step_batch
        n = len(self.assigned)
        mean = sum(self.assigned) / n if n else 0.0
        return {
            "router": self.router,
            "policy": self.policy,
            "replicas": n,
            "requests": len(recs),
            "output_tokens": out,
            "makespan_s": round(span, 4),
            "output_tok_s": round(out / span, 2) if span > 0 else 0.0,
            **latency_summary(recs, span, slo),
            "load_imbalance": round(max(self.assigned) / mean, 3) if mean else 0.0,
            "requests_per_replica": list(self.assigned),
            "mean_prefix_groups": round(float(groups.mean()), 2) if groups.size else 0.0,
            "mean_batch": round(float(batch.mean()), 2) if batch.size else 0.0,
            "preemptions": sum(rep.preemptions for rep in self.replicas),
            "prefix_hit_rate": round(
                float(np.mean([rep.prefix_hit_rate for rep in self.replicas])), 4
            ),
            "router_us_per_request": round(self.router_cpu_s / max(1, len(recs)) * 1e6, 2),
            "sim_wall_s": round(self.wall_s, 3),
            **{f"router_{k}": v for k, v in self.router_stats.items()},
        }


def simulate_cluster(
    requests: Sequence[Request],
    rule: RoutingRule,
    make_replica_policy: Callable[[], Policy],
    cost: StepCostModel,
    config: EngineConfig | None = None,
    num_replicas: int = 4,
    kill: dict[int, float] | None = None,
) -> ClusterResult:
    """Serve `requests` on `num_replicas` engines behind `rule`; every request finishes
    exactly once (checked).

    `kill` (replica index -> time) tests failure handling: at that time the replica dies,
    the router forgets it (`remove_replica`) and its unfinished requests are routed again as
    new arrivals (a client's retry on Ray Serve when a replica dies mid-request)."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    cluster = _Cluster(requests, rule, make_replica_policy, cost, config, num_replicas)
    return cluster.run(sorted((t, i) for i, t in (kill or {}).items()))


class _Cluster:
    """One cluster run: the replicas, the router and one event queue (arrivals, replica
    steps, kills), always taking the earliest event."""

    def __init__(
        self,
        requests: Sequence[Request],
        rule: RoutingRule,
        make_replica_policy: Callable[[], Policy],
        cost: StepCostModel,
        config: EngineConfig | None,
        num_replicas: int,
    ) -> None:
        self.wall0 = time.perf_counter()
        deps = _dependencies(requests)
        self.rule = rule
        self.names = [f"replica-{i}" for i in range(num_replicas)]
        self.engines = [ReplicaEngine(make_replica_policy(), cost, config) for _ in self.names]
        for e, name in zip(self.engines, self.names):
            e.open()
            rule.add_replica(name, 0.0)
        self.alive = dict.fromkeys(self.names)
        self.loads = dict.fromkeys(self.names, 0)
        self.assigned = [0] * num_replicas
        self.where: dict[str, tuple[int, Request]] = {}
        self.records: dict[str, RequestRecord] = {}
        self.children: dict[str, list[Request]] = {}
        self.heap: list[tuple[float, int, Request]] = []  # arrivals: (time, seq, request)
        self.seq = 0
        for r in sorted(requests, key=lambda r: r.arrival_time):
            if r.request_id in deps:  # enters when its parent finishes
                self.children.setdefault(deps[r.request_id], []).append(r)
            else:
                self._arrive(r.arrival_time, r)
        self.total = len(requests)
        self.router_s = 0.0

    def run(self, kills: list[tuple[float, int]]) -> ClusterResult:
        while len(self.records) < self.total:
            busy = [
                (e._now, i)
                for i, e in enumerate(self.engines)
                if self.names[i] in self.alive and e.has_work()
            ]
            t_step = min(busy) if busy else None
            t_arr = self.heap[0][0] if self.heap else None
            t_kill = kills[0][0] if kills else None
            nexts = [t for t in (t_kill, t_arr, t_step[0] if t_step else None) if t is not None]
            if not nexts:
                raise SimulationError(
                    f"{self.total - len(self.records)} requests can never run "
                    "(blocked on dependencies)"
                )
            if t_kill is not None and t_kill <= min(nexts):
                self._kill(*kills.pop(0))
            elif t_arr is not None and (t_step is None or t_arr <= t_step[0]):
                now, _, req = heapq.heappop(self.heap)
                self._route(req, now)
            else:
                self._step(t_step[1])  # type: ignore[index]
        return self._result()

    def _arrive(self, at: float, req: Request) -> None:
        heapq.heappush(self.heap, (at, self.seq, req))
        self.seq += 1

    def _route(self, req: Request, now: float) -> None:
        t0 = time.perf_counter()
        rr = RoutingRequest(req.request_id, tokens=req.prompt, max_tokens=req.output_len)
        cands = list(self.alive)
        chosen = pick(self.rule.rank(rr, cands, self.loads, now), self.loads) or cands[0]
        self.rule.on_routed(rr, chosen, now)
        self.router_s += time.perf_counter() - t0
        i = self.names.index(chosen)
        self.loads[chosen] += 1
        self.assigned[i] += 1
        self.where[req.request_id] = (i, req)
        meta = {k: v for k, v in req.meta.items() if k != "depends_on"}
        self.engines[i].submit(dataclasses.replace(req, arrival_time=now, meta=meta))

    def _kill(self, at: float, i: int) -> None:
        """Replica i dies: the router forgets it, its unfinished requests arrive again."""
        if len(self.alive) == 1:
            raise ValueError("cannot kill the last replica")
        del self.alive[self.names[i]]
        self.rule.remove_replica(self.names[i])
        for rid, (j, req) in list(self.where.items()):
            if j == i and rid not in self.records:
                self._arrive(at, req)
                self.loads[self.names[i]] -= 1

    def _step(self, i: int) -> None:
        """One step of replica i; its finished requests release their conversations' turns."""
        for rec in self.engines[i].step():
            if rec.request_id in self.records:
                raise SimulationError(f"request {rec.request_id!r} answered twice")
            self.records[rec.request_id] = rec
            self.loads[self.names[i]] -= 1
            self.rule.on_finished(rec.request_id, self.names[i], rec.finish, rec.output_len)
            for child in self.children.pop(rec.request_id, ()):
                self._arrive(max(child.arrival_time, rec.finish), child)

    def _result(self) -> ClusterResult:
        up = [i for i, n in enumerate(self.names) if n in self.alive]
        logs = [e._run.log.to_arrays() for e in self.engines]
        return ClusterResult(
            router=self.rule.name,
            policy=self.engines[0].policy.name,
            records=list(self.records.values()),
            step_groups=np.concatenate([lg["groups"] for lg in logs]),
            step_batch=np.concatenate([lg["batch"] for lg in logs]),
            assigned=[self.assigned[i] for i in up],
            replicas=[self.engines[i].close() for i in up],
            router_cpu_s=self.router_s,
            wall_s=time.perf_counter() - self.wall0,
            router_stats=dict(getattr(self.rule, "stats", None) or {}),
        )


def _dependencies(requests: Sequence[Request]) -> dict[str, str]:
    """Request id -> the request it waits for, after checking ids are unique and known."""
    ids = {r.request_id for r in requests}
    if len(ids) != len(requests):
        raise ValueError("duplicate request ids in the workload")
    deps = {r.request_id: r.meta["depends_on"] for r in requests if r.meta.get("depends_on")}
    for rid, dep in deps.items():
        if dep not in ids:
            raise ValueError(f"request {rid!r} depends on unknown request {dep!r}")
    return deps
