"""What the simulator tracks: each request's progress, and one run's queues and counters."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from feather_lab.sim.result import RequestRecord, StepLog
from feather_lab.sim.sched_cpu import SchedCpuClock
from feather_sched.host.tracker import RequestFields
from feather_sched.request import Request


@dataclass(eq=False, slots=True)
class SimSeq:
    """One simulated request in the engine: its KV progress and its timestamps. `req` is the
    workload's request (its true output decoded); `seen`, the request as the scheduler sees
    it (`scheduler_request`)."""

    req: Request
    hashes: list[int]
    seen: Request
    released_at: float = 0.0
    num_computed: int = 0
    generated: int = 0
    prefill_target: int = 0
    prefilling: bool = True
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    computed_max: int = 0  # most KV tokens it ever held: prefill below it is recompute


Scheduled = list[tuple[SimSeq, int]]
"""A step's batch: each request with the tokens it computes in the step."""


def request_fields(prefix_caching: bool) -> RequestFields:
    """How the tracker reads a `SimSeq`. As the vLLM adapter derives the CHT's chain: from
    the prefix cache's block hashes when it has them (prefix caching on), else the tokens."""
    return RequestFields(
        request_id=lambda s: s.req.request_id,
        prompt=lambda s: s.req.prompt,
        max_tokens=lambda s: s.seen.output_len,
        block_hashes=(lambda s: s.hashes) if prefix_caching else (lambda s: None),
        firm_output=lambda s: s.seen.meta.get("firm_output", True),
        request=lambda s: s.seen,
    )


def scheduler_request(req: Request, sees_output: str) -> Request:
    """The request as the scheduler sees it. `exact`: the request itself (its true output,
    firm). `cap`: its `output_len` is the client's cap, firm only under `ignore_eos`, as a
    real engine's request (`host.tracker.RequestView`: `max_tokens`, and `firm_output` from
    `ignore_eos`); the request itself where the cap is firm and equal."""
    if sees_output == "exact" or req.ignore_eos:
        return req
    cap = req.max_tokens or req.output_len
    return Request(
        req.request_id,
        req.prompt,
        cap,
        req.arrival_time,
        req.group,
        {**req.meta, "firm_output": False},
        max_tokens=cap,
    )


@dataclass(eq=False, slots=True)
class RunState:
    """One run's arrivals, progress and counters (the engine's queues live on the engine)."""

    pending: list[Request]  # every request, in arrival order; `cursor` marks the released
    deps: dict[str, str]  # request id -> the request it waits for (a conversation's turns)
    total: int
    cursor: int = 0
    blocked: dict[str, list[Request]] = field(default_factory=dict)  # parent -> children
    step: int = 0
    finished: int = 0
    records: list[RequestRecord] = field(default_factory=list)
    log: StepLog = field(default_factory=StepLog)
    policy_s: float = 0.0  # CPU time inside the policy
    engine_admit_s: float = 0.0  # CPU time of the engine's own admission bookkeeping
    recomputed: int = 0
    cpu: SchedCpuClock | None = None  # the scheduler's CPU on the clock (None: off)
    wall_start: float = field(default_factory=time.perf_counter)
