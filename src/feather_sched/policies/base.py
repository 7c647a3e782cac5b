"""One interface for every admission policy: simulator and engine adapters alike.

A scheduling step admits new requests after the running ones are served. The host (the
simulator, or the vLLM/SGLang adapter) asks the policy for candidates in order and, for each,
whether to ADD it or STOP; the host itself stops at the first candidate that does not fit
(token budget, max sequences, KV blocks), as vLLM and SGLang both do. So a policy decides
order and where to stop; the host owns memory and never lets a policy drop or duplicate a
request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import ClassVar, Protocol

from feather_sched.index.cht import ChunkedHashTree
from feather_sched.request import Request


class SchedulerView(Protocol):
    """What a policy may look at. Implemented by the simulator and by the engine adapters.

    The view is live: after the host admits a candidate, `index`, `num_running` and
    `waiting_ids()` already reflect it when the policy is asked for the next one. A host that
    also offers its KV state (`kv_gate.KvView`: free blocks, running requests' outstanding
    needs, preemptions) lets `feather` refuse candidates it cannot keep.
    """

    @property
    def now(self) -> float:
        """Current time in seconds (simulated, or wall clock in an engine)."""
        ...

    @property
    def index(self) -> ChunkedHashTree:
        """The CHT over waiting and running requests."""
        ...

    @property
    def block_size(self) -> int:
        """KV block size of the host's prefix cache, in tokens."""
        ...

    @property
    def max_num_seqs(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    def waiting_ids(self) -> Iterator[str]:
        """Waiting requests in the host's queue order (arrival order; preempted ones first)."""
        ...

    def request(self, request_id: str) -> Request: ...

    def arrival_time(self, request_id: str) -> float:
        """When the request entered the waiting queue (its effective arrival)."""
        ...

    def block_hashes(self, request_id: str) -> Sequence[int]:
        """Chained hashes of the request's full prompt blocks (the prefix cache's keys)."""
        ...

    def cached_blocks(self, request_id: str) -> int:
        """Leading prompt blocks of the request that the host's prefix cache holds now; for a
        request the host admitted earlier in this step, what it found cached then (admitting
        it cached its own blocks; the KV gate asks afterwards for the probes it put off)."""
        ...


class Policy(ABC):
    """Admission order and stop rule. Subclasses set `name` and implement `candidates`."""

    name: ClassVar[str]

    def begin_step(self, view: SchedulerView) -> None:  # noqa: B027 - optional hook
        """Called once per step before candidates are asked for (e.g. compute priorities)."""

    def idle_pass(self, view: SchedulerView) -> None:  # noqa: B027 - optional hook
        """The host reached its waiting phase with requests waiting but no room to admit
        (token budget spent, or `max_num_seqs` running), so it asks for no candidates this
        step. A policy that keeps the engine's queue order across steps updates it here, as
        the engine would (vllm-cache-aware)."""

    @abstractmethod
    def candidates(self, view: SchedulerView) -> Iterator[str]:
        """Waiting request ids in the order to admit them.

        Generated lazily: the host admits each yielded id before asking for the next, and
        stops iterating when the step is full. Yield each waiting id at most once per step.
        """

    def accept(self, view: SchedulerView, request_id: str) -> bool:
        """ADD (True) or STOP (False) for the candidate just yielded. Default: always ADD."""
        return True

    def follows_queue_order(self, view: SchedulerView) -> bool:
        """True when, this step, the policy would yield the waiting queue in the host's order
        and ADD every candidate. A host may then skip the policy for the step and run its own
        loop (the vLLM adapter does: no per-candidate work). Default: never claimed."""
        return False

    def end_step(  # noqa: B027 - optional hook
        self, view: SchedulerView, step_time: float, batch_size: int, prefill_tokens: int = 0
    ) -> None:
        """Feedback after a step ran: its duration, how many sequences it served, and how
        many of its tokens were prefill (hosts that cannot tell pass 0)."""

    def reset(self) -> None:  # noqa: B027 - optional hook
        """Forget per-run state (a fresh simulation)."""


def require(ok: bool, message: str) -> None:
    """A policy option's check: a ValueError naming the value unless `ok`."""
    if not ok:
        raise ValueError(message)


def is_decode_step(batch_size: int, prefill_tokens: int) -> bool:
    """A step mostly spent on decodes (no more prefill tokens than sequences). Only such
    steps measure what a batch's composition costs: a prefill is a one-off cost every request
    pays whenever it is admitted, and the chunk of a 10,000-token prompt would otherwise swamp
    the signal of the batch it joins. The learners' feedback filters share this one rule."""
    return prefill_tokens <= batch_size


_COUNTERS = {
    "decisions": "policy_decisions",
    "stops": "policy_stops",
    "explorations": "policy_explorations",
    "starvation_admits": "starvation_admits",
    "kv_refusals": "kv_refusals",
    "hold_releases": "hold_releases",
    "stop_vetoes": "stop_vetoes",
}


def policy_counters(policy: Policy) -> dict[str, int]:
    """What a learning policy says of itself this run, for a bench row: ADD/STOP questions
    it answered, STOPs, exploratory STOPs, starvation admits, candidates refused for KV, steps
    released to the engine's order by the hold bound, candidates the STOP delay bound ADDed
    unasked (absent where it has none)."""
    return {
        out: int(getattr(policy, attr))
        for attr, out in _COUNTERS.items()
        if isinstance(getattr(policy, attr, None), int)
    }


class PolicyError(RuntimeError):
    """A policy broke its contract (yielded an unknown or duplicate id)."""
