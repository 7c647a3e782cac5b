"""The policy's side of one admission step, shared by every host (simulator, vLLM, SGLang).

`AdmissionPass` runs one step's dialogue: leave the step to the engine where the policy follows
its order; else offer candidates in the policy's order, check the contract (a waiting id, never
twice), ask ADD/STOP, and never stall (with nothing running, the queue head is admitted).
`PolicyHost` owns the policy, the counters and the failure rule: an engine host logs a broken
policy once and finishes the step in the engine's order; the simulator (`strict`) raises."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from feather_sched.policies.base import Policy, PolicyError, SchedulerView

__all__ = ["AdmissionPass", "HostStats", "Hosted", "PolicyHost"]

logger = logging.getLogger("feather_sched")
T = TypeVar("T")


@dataclass
class HostStats:
    """Counters every host keeps, readable off a live scheduler or a simulation."""

    policy_steps: int = 0
    """Steps whose admission the policy drove (at least one candidate asked for)."""
    queue_order_steps: int = 0
    """Steps left to the engine's own order because the policy said it would follow it."""
    decisions: int = 0
    """Candidates the policy was asked ADD or STOP."""
    stops: int = 0
    """Steps ended by the policy's STOP."""
    admitted: int = 0
    forced: int = 0
    """Queue heads admitted because the policy stopped while nothing was running."""
    handovers: int = 0
    """Steps handed to the engine's order because the engine walked past the policy's
    candidate (SGLang: a LoRA limit, another list)."""
    deferrals: int = 0
    """Requests an engine host left waiting for a pass because another request of the same
    pass is about to compute their shared prefix (SGLang: they would compute it again)."""
    resyncs: int = 0
    """Times the CHT had drifted from the engine's queues and was rebuilt (should stay 0)."""
    hashed: int = 0
    """Prompts hashed into the CHT (engines without block hashes of their own)."""
    ordering_s: float = 0.0
    """CPU seconds in Feather's ordering, where the host measures it (SGLang, when its
    queue's `timer` is set: a benchmark's option, not a server's)."""
    policy_errors: int = 0
    feedback_steps: int = 0
    last_error: str | None = None


class PolicyHost:
    """A policy, its host's counters and the failure rule, for one engine or simulation."""

    def __init__(self, policy: Policy, engine: str, strict: bool = False) -> None:
        self.policy = policy
        self.engine = engine
        self.strict = strict
        self.stats = HostStats()

    def begin(
        self,
        view: SchedulerView,
        is_waiting: Callable[[str], bool],
        allow_queue_order: bool = True,
    ) -> AdmissionPass:
        """A new step's admission pass. `allow_queue_order=False` always asks the policy,
        even in a step it says it would leave to the queue order (the simulator does, so its
        decision counts and CPU times cover every step of a run)."""
        return AdmissionPass(self, view, is_waiting, allow_queue_order)

    def feedback(
        self, view: SchedulerView, step_time: float, batch_size: int, prefill_tokens: int
    ) -> None:
        """A scheduled step finished: tell the policy (its reward signal)."""
        self.stats.feedback_steps += 1
        try:
            self.policy.end_step(view, step_time, batch_size, prefill_tokens)
        except Exception as err:
            self.failed(err)

    def idle(self, view: SchedulerView) -> None:
        """A step whose waiting phase had no room to admit (`Policy.idle_pass`)."""
        try:
            self.policy.idle_pass(view)
        except Exception as err:
            self.failed(err)

    def failed(self, err: BaseException) -> None:
        """Count a policy failure and log the first one; re-raise where the host is strict."""
        if self.strict:
            raise err
        self.stats.policy_errors += 1
        self.stats.last_error = f"{type(err).__name__}: {err}"
        if self.stats.policy_errors == 1:
            logger.error(
                "feather policy %r failed; this step continues in %s's own order "
                "(logged once; later failures are only counted)",
                getattr(self.policy, "name", self.policy),
                self.engine,
                exc_info=err,
            )


class Hosted:
    """An engine adapter that runs its policy through `self.host`: the live policy (swap it
    between steps, e.g. `scheduler.feather.policy = make_policy("grouped")`) and the
    host's counters."""

    host: PolicyHost

    @property
    def policy(self) -> Policy:
        return self.host.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.host.policy = policy

    @property
    def stats(self) -> HostStats:
        return self.host.stats


class AdmissionPass:
    """One step's candidates, ADD/STOP and never-stall rule. `engine_order` is True once the
    rest of the step belongs to the engine's own order (the policy follows it, or failed)."""

    def __init__(
        self,
        host: PolicyHost,
        view: SchedulerView,
        is_waiting: Callable[[str], bool],
        allow_queue_order: bool = True,
    ) -> None:
        self.host = host
        self.view = view
        self._is_waiting = is_waiting
        self._seen: set[str] = set()
        self._forced = False
        self._candidates: Iterator[str] | None = None
        self.engine_order = True
        """True once the rest of the step belongs to the engine's own order (a plain
        attribute: the SGLang adapter reads it on every offer)."""
        policy, stats = host.policy, host.stats
        try:
            if allow_queue_order and policy.follows_queue_order(view):
                stats.queue_order_steps += 1
            else:
                stats.policy_steps += 1
                policy.begin_step(view)
                self._candidates = iter(policy.candidates(view))
                self.engine_order = False
        except Exception as err:
            host.failed(err)

    def next_candidate(self) -> str | None:
        """The policy's next candidate, or None when it has none left (or failed: then the
        engine's order takes over)."""
        if self._candidates is None:
            return None
        try:
            rid = next(self._candidates, None)
            if rid is not None and (rid in self._seen or not self._is_waiting(rid)):
                why = "twice in one step" if rid in self._seen else "that is not waiting"
                raise PolicyError(f"policy {self.host.policy.name!r} proposed {rid!r} {why}")
        except Exception as err:
            self.hand_over(err)
            return None
        if rid is not None:
            self._seen.add(rid)
        return rid

    def accept(self, rid: str) -> bool:
        """ADD (True) or STOP (False) for the candidate just proposed. A failing policy hands
        the step to the engine's order and the candidate is admitted (True)."""
        stats = self.host.stats
        stats.decisions += 1
        try:
            add = bool(self.host.policy.accept(self.view, rid))
        except Exception as err:
            self.hand_over(err)
            return True
        if not add:
            stats.stops += 1
        return add

    def force_head(self, num_running: int, head: Callable[[], T | None]) -> T | None:
        """Never stall: after a STOP (or no candidate) with nothing running, the host admits
        its queue head, once per step (what FCFS would do). Every host asks here, with its
        own way to read its head (`head`, None when its queue is empty), and admits what this
        returns through its engine's own admission; None: admit nothing more this step."""
        if num_running or self._forced:
            return None
        first = head()
        if first is None:
            return None
        self._forced = True
        self.host.stats.forced += 1
        return first

    def hand_over(self, err: BaseException | None = None) -> None:
        """The rest of the step follows the engine's order (the policy failed, or the engine
        walked past the policy's candidate)."""
        self.close()
        if err is not None:
            self.host.failed(err)

    def close(self) -> None:
        """End the step: close the policy's candidate generator (its `finally` runs now)."""
        candidates, self._candidates = self._candidates, None
        self.engine_order = True
        close = getattr(candidates, "close", None)
        if close is not None:
            close()
