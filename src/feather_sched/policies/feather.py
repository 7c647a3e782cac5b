"""Feather: learn, online, when to stop growing a batch (the paper's policy).

Candidates come from the CHT (most chunks shared with the running batch first), or in the
engine's own order where grouping cannot pay (`order.GroupingJudge`). A candidate that would
open a new prefix group in a non-empty batch is asked ADD or STOP; the bandit
(`learner.BanditLearner`) answers from a small discrete state (`features.DecisionState`),
with the cost model's prior where there is one (`stop_prior.StopPrior`). ADD is the engine's
status quo, so a state without evidence ADDs. Starvation (`starvation`), the tail STOPs add
(`hold.StopDelay`) and KV thrashing (`kv_gate`) are bounded by their own parts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies import state_file
from feather_sched.policies.bandit import STOP
from feather_sched.policies.base import Policy, SchedulerView
from feather_sched.policies.fcfs import queue_head
from feather_sched.policies.features import DecisionState, decision_state
from feather_sched.policies.grouped import grouped_candidates
from feather_sched.policies.hold import MAX_HOLD_STEPS, STOP_DELAY_SHARE, HoldBound, StopDelay
from feather_sched.policies.kv_gate import KvGate
from feather_sched.policies.learner import BanditLearner
from feather_sched.policies.order import GroupingJudge
from feather_sched.policies.output_estimate import OutputEstimate
from feather_sched.policies.starvation import (
    MAX_WAIT_S,
    STARVATION_SHARE,
    WAIT_FACTOR,
    StarvationGuard,
)
from feather_sched.policies.stop_prior import StopPrior


class _LearnerField:
    """An attribute of the policy's `learner`, read and written through the policy."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, policy: Any, owner: type | None = None) -> Any:
        return self if policy is None else getattr(policy.learner, self.name)

    def __set__(self, policy: Any, value: Any) -> None:
        setattr(policy.learner, self.name, value)


class FeatherPolicy(Policy):
    name = "feather"

    table = _LearnerField()
    budget = _LearnerField()
    reward_scale = _LearnerField()
    sec_per_token = _LearnerField()
    history = _LearnerField()
    total_decisions = _LearnerField()
    learn = _LearnerField()

    def __init__(
        self,
        alpha: float = 0.1,
        confidence: float = 1.0,
        initial_budget: float = 1.0,
        horizon: int = 4,
        max_wait_s: float = MAX_WAIT_S,
        starvation_share: float = STARVATION_SHARE,
        wait_factor: float = WAIT_FACTOR,
        learn: bool = True,
        policy_state: str | Path | None = None,
        cost: StepCostModel | None = None,
        prior_error: float = 0.05,
        kv_gate: bool = True,
        max_hold_steps: int | None = MAX_HOLD_STEPS,
        stop_delay_share: float | None = STOP_DELAY_SHARE,
    ) -> None:
        """`alpha`: exploration budget, a fraction of the rewards received; `confidence`:
        standard errors STOP's lead must clear; `prior_error`: standard error of the cost
        model's relative gain; `cost`: the step-cost model of the hardware (None: no prior;
        from profile names: `make_policy("feather", hardware=..., model=...)`);
        `max_wait_s`, `starvation_share`, `wait_factor`: the starvation guard's;
        `max_hold_steps`: steps in a row the KV gate may hold the queue back (None: until
        the KV fits, trading time to first token for throughput; hold.py);
        `stop_delay_share`: the most of the oldest waiting request's wait that STOPs, net of
        what they save, may have held it back (None: no bound; hold.StopDelay)."""
        self.learner = BanditLearner(alpha, confidence, initial_budget, horizon, learn)
        if prior_error <= 0:
            raise ValueError(f"prior_error must be > 0, got {prior_error}")
        self.cost = cost
        self.prior_error = prior_error
        self.outputs = OutputEstimate()
        self.stop_prior = None if cost is None else StopPrior(cost, prior_error, self.outputs)
        self.guard = StarvationGuard(max_wait_s, starvation_share, wait_factor)
        self.judge = GroupingJudge(self.cost, self.outputs)
        self.gate = KvGate(self.outputs) if kv_gate else None
        self.hold = HoldBound(max_hold_steps)
        self.delay = StopDelay(stop_delay_share)
        if policy_state is not None:
            self.load(policy_state)
        self._reset_run()

    # ------------------------------------------------------------------ Policy
    def reset(self) -> None:
        """A new run keeps what was learned (online learning across runs) but not the
        run's pending windows."""
        self._reset_run()

    def _reset_run(self) -> None:
        self.learner.reset()
        self._forced: str | None = None
        self.guard.reset()
        self.judge.reset()
        self.outputs.reset()
        self._engine_order = False
        if self.gate is not None:
            self.gate.reset()
        self.hold.reset()
        self.delay.reset()
        self._gating = False
        self._step_now: float | None = None
        self._minority: dict[tuple[int, ...], tuple[int, float]] = {}
        """This step's verdicts on minority groups, by (prefix depth, decision bins)."""
        self.decisions = 0
        self.stop_lead = 0.0  # the last decision's `bandit.Choice.lead`
        self.stops = 0
        self.explorations = 0

    @property
    def starvation_admits(self) -> int:
        return self.guard.forced

    @property
    def kv_refusals(self) -> int:
        return 0 if self.gate is None else self.gate.refusals

    @property
    def hold_releases(self) -> int:
        return self.hold.releases

    @property
    def stop_vetoes(self) -> int:
        return self.delay.vetoes

    def begin_step(self, view: SchedulerView) -> None:
        # The gate acts where Feather reorders: a step it would leave to the queue order is
        # the engine's own (the vLLM adapter does not even ask), and so the same here.
        # Where grouping cannot pay (`order.GroupingJudge`) the candidates come in the
        # engine's order; a new group's candidate is still asked ADD or STOP.
        self.outputs.update(view)
        self._engine_order = not self.judge.grouping_pays(view)
        self._step_now = view.now  # the admissions' time: one clock read a step, not each
        self._minority.clear()
        released = self.hold.begin_step()  # the gate stands aside this step
        self._gating = self.gate is not None and not released and not self.follows_queue_order(view)
        if self.gate is not None:
            self.gate.begin_step(view)

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        if self._engine_order:  # the engine's order: the oldest first, no guard needed
            self._forced = None
            yield from queue_head(view)
            return
        self._forced = self.guard.pick(view)
        if self._forced is not None:
            yield self._forced
        yield from grouped_candidates(view)

    def follows_queue_order(self, view: SchedulerView) -> bool:
        # No shared chunk anywhere: candidates are the queue head each time (starving ones
        # first, which is the head too) and none loses a prefix, so all are ADDed unasked.
        return view.index.num_shared_roots == 0

    def accept(self, view: SchedulerView, request_id: str) -> bool:
        forced = request_id == self._forced
        if self._gating and view.num_running > 0:
            if not self.gate.fits(view, request_id):
                self.hold.held()
                return False
            # a host without a KV view (SGLang): every candidate fits, stop asking this step
            self._gating = not self.gate.blind
        if not forced:
            state = decision_state(view.index, request_id)
            if (
                self.asks(state, grouped=not self._engine_order)
                and self._may_stop(view)
                and self._verdict(view, state, request_id) == STOP
            ):
                self.delay.stopped(view.now, self.stop_lead)
                return False
        self.guard.admitted(view, request_id, forced, self._step_now)
        return True

    def _verdict(self, view: SchedulerView, state: DecisionState, request_id: str) -> int:
        """ADD or STOP for a candidate the policy asks. A minority group's verdict holds
        for the rest of the step (`_minority`): its members come one after another in
        grouped order with the same decision state, and asking the table again for each
        costs the engine's scheduling pass an ask a member (a table choice, a learning
        window credited the same reward as its neighbours') to learn nothing new."""
        if state.new_chunks > 0:
            return self.decide(
                state, self.prior(view, state, request_id), self._explores(view, state)
            )
        key = (state.depth, *state.group_bins())
        known = self._minority.get(key)
        if known is None:
            action = self.decide(state, self.prior(view, state, request_id), False)
            self._minority[key] = (action, self.stop_lead)
            return action
        action, self.stop_lead = known
        self.decisions += 1
        self.stops += action == STOP
        return action

    def _explores(self, view: SchedulerView, state: DecisionState) -> bool:
        """Whether the bandit may spend its budget on an exploratory STOP: only to open a new
        group (`GroupingJudge.explores_stop`); a minority group's member is held back only
        where STOP wins with confidence, as that group already runs."""
        return state.new_chunks > 0 and self.judge.explores_stop(view)

    def _may_stop(self, view: SchedulerView) -> bool:
        """Whether a STOP now keeps the tail bound (`hold.StopDelay`); if not, the candidate
        is added unasked. Free with the bound off (`feather-hold`): nothing is read."""
        if self.delay.share is None:
            return True
        head = next(view.waiting_ids(), None)
        if head is None:
            return True
        return self.delay.allows(view.now, view.arrival_time(head), self.guard.mean_wait)

    def asks(self, state: DecisionState, grouped: bool = True) -> bool:
        """A decision is needed to open a new prefix group in a non-empty batch (the
        candidate's shared prefix is not running yet) and, in grouped order, to grow a group
        that runs as a minority of the batch (fewer than half of it hold the prefix: one let
        in by the starvation guard or the STOP delay bound, not by a decision to mix; in the
        engine's order a STOP there would hold up the queue behind it). Members of the
        batch's main group join unasked (the group was the decision), as does a request
        that shares nothing."""
        if state.batch <= 0:
            return False
        return state.new_chunks > 0 or (grouped and not state.joins_majority)

    def prior(
        self, view: SchedulerView, state: DecisionState, request_id: str
    ) -> tuple[float, float] | None:
        """The cost model's gain of STOP over ADD and its standard error (`StopPrior`), or
        None without a model."""
        if self.stop_prior is None:
            return None
        return self.stop_prior.estimate(view, state, request_id)

    def decide(
        self, state: DecisionState, prior: tuple[float, float] | None = None, explore: bool = True
    ) -> int:
        """ADD or STOP for a candidate that opens a new prefix group; records it for
        credit. `explore=False`: no exploratory STOP (`GroupingJudge.explores_stop`)."""
        choice = self.learner.choose(state, prior, explore)
        if choice.exploring:
            self.explorations += 1
        self.stop_lead = choice.lead
        self.decisions += 1
        if choice.action == STOP:
            self.stops += 1
        return choice.action

    def end_step(
        self, view: SchedulerView, step_time: float, batch_size: int, prefill_tokens: int = 0
    ) -> None:
        self.judge.observe()
        self.delay.end_step(step_time)
        self.learner.end_step(step_time, batch_size, prefill_tokens)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write the learned table and scales (atomically: `state_file.write_state`)."""
        return state_file.write_state(path, self.name, self.learner.state())

    @classmethod
    def read_state(cls, path: str | Path) -> dict:
        """A saved table's payload, checked (a caller validating its input before any run
        reads the file without building a policy); FileNotFoundError/ValueError say why
        it cannot be loaded."""
        return state_file.read_state(path, cls.name)

    def load(self, path: str | Path) -> None:
        self.learner.restore(self.read_state(path))


class FeatherHoldPolicy(FeatherPolicy):
    """Feather, its KV holds and STOPs unbounded (trades TTFT).

    `max_hold_steps=None`: fewer preemptions and more throughput under KV pressure;
    `stop_delay_share=None`: STOPs may hold a group back as long as the bandit likes. A name
    of its own so the trade is a row of its own in every table, beside the default that
    keeps the tail."""

    name = "feather-hold"

    def __init__(
        self,
        max_hold_steps: int | None = None,
        cost: StepCostModel | None = None,
        stop_delay_share: float | None = None,
        **options: Any,
    ) -> None:
        super().__init__(
            max_hold_steps=max_hold_steps,
            cost=cost,
            stop_delay_share=stop_delay_share,
            **options,
        )
