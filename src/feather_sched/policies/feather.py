"""Feather: learn, online, when to stop growing a batch (the paper's policy).

Candidates come from the CHT (the waiting request sharing the most chunks with the running
batch; the oldest waiting one when none shares anything), except in steps where grouped order
cannot pay (`order.GroupingJudge`: the engine's order fills the free slots soon, nothing is
preempted, and the cost model prices no locality), where they come in the engine's own order.
For each, a contextual bandit picks ADD or STOP from a small discrete state
(`features.DecisionState`: batch-size bin, bin of shared-prefix chunks the candidate would
bring in, bin of its waiting group's size). Only a candidate that would open a new prefix
group in a non-empty batch is asked about; one whose group already runs, that shares nothing
with anyone, or that meets an empty batch is added.

Reward = batch size / step time (tokens per second), credited to a decision over a window:
its own step, charged only its *marginal* time (the step's time minus what its prefill tokens
cost at the best per-token rate seen, so decodes riding in a compute-bound prefill step come
almost free), then the `horizon` decode-dominated steps after it (steps mostly spent on
prefill are skipped: a prefill is a one-off cost every request pays whenever it is admitted).
The own step is what a STOP gives up (a step that could have carried prefill work runs decodes
alone); the later steps are what an ADD costs (every decode now reads one more prefix).
Rewards are compared in units of the largest decode-step throughput seen, so the budget and
the confidence bound mean the same on any hardware.

Never worse than the engine: ADD is the status quo, so a state without evidence ADDs. The
table (`bandit.BanditTable`) STOPs where STOP's mean reward beats ADD's with confidence (a
one-sided Welch bound, `confidence` standard errors), and otherwise tries STOP only when the
exploration budget pays for it: the budget grows by `alpha` of each reward received (in units
of the best decode throughput seen) and each exploratory STOP spends its expected loss, so the
run's throughput stays within about `alpha` of always-ADD while it learns (the conservative
bandit of Wu et al., ICML 2016). `initial_budget` lets a cold run try STOP a couple of times
before any reward has arrived: in a burst where everything arrives at once, the first
admission wave is the only chance to see a homogeneous batch at all.

With a step-cost model of the hardware (`cost`, from `hardware` and `model` profiles: the
one `feather calibrate` fits for a real engine), each decision also gets a prior: the time
the model predicts for serving the running batch and the candidate's waiting group together
(ADD) or one after the other (STOP), as a relative gain with standard error `prior_error`.
Prior and rewards combine by precision (`bandit.combine`), so in a one-shot burst, where the
first admissions decide the whole run before any reward arrives, the model decides, and in a
long run the measured rewards do.

Learning generalises through back-off: a state with fewer than two rewards for either action
decides from a coarse state, (candidate's group bin - batch bin, lost bin), shared by every
batch size where the candidate's group is as large relative to the batch. The table can be
saved and loaded so a deployment starts warm. Nothing starves: `starvation.StarvationGuard`
admits an over-age queue head first, within a bounded share of admissions, and
`hold.StopDelay` bounds what STOPs add to the tail: a STOP becomes an ADD once STOPs have held
the oldest waiting request back for `stop_delay_share` of its wait, each STOP step counted net
of the time its lead saves the requests behind it (hold.py: what it fixes and what it costs;
`feather-hold` leaves STOPs unbounded). Nothing thrashes:
in the steps it reorders, `kv_gate.KvGate` refuses a candidate whose KV the engine could not
keep as the running requests grow, so a prefix order does not preempt (and recompute) what it
just admitted.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feather_sched.cost.step_model import BatchShape, StepCostModel
from feather_sched.policies.bandit import STOP, BanditTable
from feather_sched.policies.base import Policy, SchedulerView, is_decode_step
from feather_sched.policies.fcfs import queue_head
from feather_sched.policies.features import DecisionState, decision_state
from feather_sched.policies.grouped import grouped_candidates
from feather_sched.policies.hold import MAX_HOLD_STEPS, STOP_DELAY_SHARE, HoldBound, StopDelay
from feather_sched.policies.kv_gate import KvGate
from feather_sched.policies.order import GroupingJudge
from feather_sched.policies.starvation import (
    MAX_WAIT_S,
    STARVATION_SHARE,
    WAIT_FACTOR,
    StarvationGuard,
)

_STATE_VERSION = 4
PRIOR_CACHE_SIZE = 4096
"""Plan sizes whose prior gain is kept (cleared when full: a cache, never a table)."""


@dataclass(slots=True)
class _Window:
    """A decision waiting for its reward: tokens and (charged) seconds seen so far."""

    key: tuple[int, ...]
    action: int
    own_step_done: bool = False
    decode_steps: int = 0
    tokens: float = 0.0
    seconds: float = 0.0


def mix(a: BatchShape, b: BatchShape) -> BatchShape:
    """Two decode batches run as one (their prefixes distinct, each group adjacent)."""
    n = a.num_decode + b.num_decode
    logical = a.logical_kv_tokens + b.logical_kv_tokens
    span = (a.shared_span_tokens * a.num_decode + b.shared_span_tokens * b.num_decode) / n
    return BatchShape(
        num_decode=n,
        logical_kv_tokens=logical,
        unique_kv_tokens=a.unique_kv_tokens + b.unique_kv_tokens,
        shared_unique_kv_tokens=a.shared_unique_kv_tokens + b.shared_unique_kv_tokens,
        shared_logical_kv_tokens=a.shared_logical_kv_tokens + b.shared_logical_kv_tokens,
        shared_span_tokens=span,
    )


class FeatherPolicy(Policy):
    name = "feather"

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
        model's relative gain (smaller than its step-time error, as both plans share its
        bias); `cost`: the step-cost model of the hardware (None: no prior; from profile
        names: `make_policy("feather", hardware=..., model=...)`, `cost.resolve_cost`);
        `max_wait_s`, `starvation_share`, `wait_factor`: the starvation guard's;
        `max_hold_steps`: steps in a row the KV gate may hold the queue back (None: until
        the KV fits, trading time to first token for throughput; hold.py);
        `stop_delay_share`: the most of the oldest waiting request's wait that STOPs, net of
        what they save, may have held it back (None: no bound; hold.StopDelay). Each default
        was measured at half and double its value on the simulator suite (none beaten by
        over 0.5% on any workload but `stop_delay_share`: half runs paper-100g 3.6% faster;
        benchmarks/feather.md, "The constants, measured", bandit_constants.py)."""
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        if not 0 <= alpha < 1:
            raise ValueError(f"alpha must be in [0, 1), got {alpha}")
        if initial_budget < 0:
            raise ValueError(f"initial_budget must be >= 0, got {initial_budget}")
        if prior_error <= 0:
            raise ValueError(f"prior_error must be > 0, got {prior_error}")
        self.cost = cost
        self._priors: dict[tuple[int, ...], float] = {}
        self.prior_error = prior_error
        self.alpha = alpha
        self.confidence = confidence
        self.initial_budget = initial_budget
        self.horizon = horizon
        self.guard = StarvationGuard(max_wait_s, starvation_share, wait_factor)
        self.judge = GroupingJudge(self.cost)
        self.gate = KvGate() if kv_gate else None
        self.hold = HoldBound(max_hold_steps)
        self.delay = StopDelay(stop_delay_share)
        self.learn = learn
        self.table = BanditTable(confidence)
        self.reward_scale = 0.0  # best decode-step tokens/s seen: the unit of gains
        self.sec_per_token = math.inf  # best step seconds per scheduled token seen
        if policy_state is not None:
            self.load(policy_state)
        self.history: list[tuple[int, float]] = []  # (lifetime decisions, window reward)
        self.total_decisions = 0
        self._reset_run()

    # ------------------------------------------------------------------ Policy
    def reset(self) -> None:
        """A new run keeps what was learned (online learning across runs) but not the
        run's pending windows."""
        self._reset_run()

    def _reset_run(self) -> None:
        self._windows: list[_Window] = []
        self._forced: str | None = None
        self.guard.reset()
        self.judge.reset()
        self._engine_order = False
        if self.gate is not None:
            self.gate.reset()
        self.hold.reset()
        self.delay.reset()
        self._gating = False
        self._step_now: float | None = None
        self.budget = self.initial_budget
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
        self._engine_order = not self.judge.grouping_pays(view)
        self._step_now = view.now  # the admissions' time: one clock read a step, not each
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
                self.asks(state)
                and self._may_stop(view)
                and self.decide(
                    state, self.prior(view, state, request_id), self.judge.explores_stop(view)
                )
                == STOP
            ):
                self.delay.stopped(view.now, self.stop_lead)
                return False
        self.guard.admitted(view, request_id, forced, self._step_now)
        return True

    def _may_stop(self, view: SchedulerView) -> bool:
        """Whether a STOP now keeps the tail bound (`hold.StopDelay`); if not, the candidate
        is added unasked. Free with the bound off (`feather-hold`): nothing is read."""
        if self.delay.share is None:
            return True
        head = next(view.waiting_ids(), None)
        if head is None:
            return True
        return self.delay.allows(view.now, view.arrival_time(head), self.guard.mean_wait)

    def asks(self, state: DecisionState) -> bool:
        """A decision is needed only to open a new prefix group in a non-empty batch: the
        candidate's shared prefix is not running yet. Members of a group that runs join
        unasked (the group was the decision), as does a request that shares nothing."""
        return state.batch > 0 and state.new_chunks > 0

    def prior(
        self, view: SchedulerView, state: DecisionState, request_id: str
    ) -> tuple[float, float] | None:
        """The cost model's gain of STOP over ADD, or None without a model.

        Two plans for the running batch (`state.batch` requests in `num_running_roots`
        groups) and the candidate's whole waiting group (once a group runs, its members join
        unasked as slots free up), each decoding the candidate's output length: ADD decodes
        them together; STOP lets the batch decode alone, then the group alone. The gain is
        STOP's time saving relative to the slower plan (both also pay the group's prefill,
        counted in the denominator). A marginal comparison (the batch with the group against
        without it) misses that a STOP lets a mixed batch drain back to homogeneous ones.
        The batch's groups are taken to share a prefix as long as its oldest request's
        (`running_shared_chunks`).
        """
        if self.cost is None:
            return None
        index = view.index
        req = view.request(request_id)
        prefix = state.depth * index.chunk_size
        suffix = max(0, req.prompt_len - prefix)
        running = index.running_shared_chunks() * index.chunk_size or prefix
        b, g = state.batch, max(1, min(state.batch, index.num_running_roots))
        n = max(1, min(state.group, view.max_num_seqs))  # once open, the group floods in
        plans = (b, g, n, prefix, suffix, running, req.output_len)
        gain = self._priors.get(plans)
        if gain is None:
            if len(self._priors) >= PRIOR_CACHE_SIZE:
                self._priors.clear()
            gain = self._priors[plans] = self._plan_gain(*plans)
        return gain, self.prior_error

    def _plan_gain(
        self, b: int, g: int, n: int, prefix: int, suffix: int, running: int, steps: int
    ) -> float:
        """`prior`'s relative gain for one set of plan sizes (cached: under a backlog the
        same candidate is asked about step after step)."""
        assert self.cost is not None
        sizes = [b // g + (i < b % g) for i in range(g)]
        t, decode = self.cost.step_time, BatchShape.shared_prefix_decode
        tokens = prefix + n * suffix
        prefill = t(
            BatchShape(
                num_prefill_tokens=tokens,
                prefill_attn_pairs=prefix * (prefix + 1) // 2 + n * suffix * (prefix + suffix),
                logical_kv_tokens=tokens,
                unique_kv_tokens=tokens,
                num_prefill_seqs=n,
            )
        )
        batch, group = decode(sizes, running, suffix), decode([n], prefix, suffix)
        stop = steps * (t(batch) + t(group))
        add = steps * t(mix(batch, group))
        return (add - stop) / (max(add, stop) + prefill)

    def decide(
        self, state: DecisionState, prior: tuple[float, float] | None = None, explore: bool = True
    ) -> int:
        """ADD or STOP for a candidate that opens a new prefix group; records it for
        credit. `explore=False`: no exploratory STOP (`GroupingJudge.explores_stop`)."""
        key = state.group_bins()
        if self.learn:
            # An untried STOP keeps a batch of B from taking the candidate's waiting group
            # of G (the step ends before it): its step throughput falls by at most G/(B+G),
            # as a step never gets faster with more sequences. (1/(B+1), a group of one,
            # priced a held-back group of 16 at a sixteenth of its cost: SGLang's loop, where
            # a STOP holds the group a whole pass, lost 7% to exploration that cheap.)
            held = max(1, state.group)
            untried = held / (state.batch + held)
            budget = self.budget if explore else -1.0  # below any cost: exploit only
            choice = self.table.choose(key, self.reward_scale, budget, untried, prior)
            if choice.exploring:
                self.budget -= choice.cost
                self.explorations += 1
            self.table.pull(key, choice.action)
        else:
            choice = self.table.exploit(key, self.reward_scale, prior)
        action = choice.action
        self.stop_lead = choice.lead
        self.decisions += 1
        self.total_decisions += 1
        if action == STOP:
            self.stops += 1
        if self.learn:
            self._windows.append(_Window(key, action))
        return action

    def end_step(
        self, view: SchedulerView, step_time: float, batch_size: int, prefill_tokens: int = 0
    ) -> None:
        self.judge.observe()
        self.delay.end_step(step_time)
        if step_time <= 0 or batch_size <= 0:
            return
        per_token = step_time / (prefill_tokens + batch_size)
        if per_token < self.sec_per_token:
            self.sec_per_token = per_token
        decode_step = is_decode_step(batch_size, prefill_tokens)
        if decode_step:
            throughput = batch_size / step_time
            if throughput > self.reward_scale:
                self.reward_scale = throughput
        if not self._windows:
            return
        # The decision's own step, at marginal cost: what its prefill tokens would cost alone
        # is not charged (>= sec_per_token * batch_size > 0 by the update above).
        marginal = step_time - self.sec_per_token * prefill_tokens
        still_open = []
        for w in self._windows:
            if not w.own_step_done:
                w.own_step_done = True
                w.tokens += batch_size
                w.seconds += marginal
            elif decode_step:
                w.decode_steps += 1
                w.tokens += batch_size
                w.seconds += step_time
            if w.decode_steps >= self.horizon:
                reward = w.tokens / w.seconds
                self.table.update(w.key, w.action, reward)
                self.budget += self.alpha * reward / (self.reward_scale or reward)
                self.history.append((self.total_decisions, reward))
            else:
                still_open.append(w)
        self._windows = still_open

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        """Write the table (atomically: a server saving while another process loads, or a
        crash mid-write, never leaves a half-written file)."""
        path = Path(path)
        payload = {
            "version": _STATE_VERSION,
            "policy": self.name,
            "alpha": self.alpha,
            "confidence": self.confidence,
            "horizon": self.horizon,
            "reward_scale": self.reward_scale,
            "sec_per_token": self.sec_per_token if math.isfinite(self.sec_per_token) else None,
            "table": self.table.to_dict(),
        }
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(payload, indent=1) + "\n")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)  # only left over when the write failed
        return path

    @classmethod
    def read_state(cls, path: str | Path) -> dict:
        """A saved table's payload, checked (a caller validating its input before any run
        reads the file without building a policy); FileNotFoundError/ValueError say why
        it cannot be loaded."""
        path = Path(path)
        try:
            payload = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"policy state file not found: {path}") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not a Feather policy state (bad JSON: {err})") from None
        if payload.get("policy") != cls.name or payload.get("version") != _STATE_VERSION:
            raise ValueError(
                f"{path}: not a version-{_STATE_VERSION} {cls.name!r} policy state "
                f"(policy={payload.get('policy')!r}, version={payload.get('version')!r}); "
                "tables saved before version 4 hold the old UCB bandit's statistics and "
                "cannot be read: delete the file to start cold"
            )
        return payload

    def load(self, path: str | Path) -> None:
        payload = self.read_state(path)
        self.table = BanditTable.from_dict(payload["table"], self.confidence)
        self.reward_scale = float(payload.get("reward_scale", 0.0))
        sec = payload.get("sec_per_token")
        self.sec_per_token = float(sec) if sec else math.inf


class FeatherHoldPolicy(FeatherPolicy):
    """Feather, its KV holds and STOPs unbounded (trades TTFT).

    `max_hold_steps=None`: fewer preemptions and more throughput under KV pressure;
    `stop_delay_share=None`: STOPs that pay a few percent of throughput may hold a group back
    as long as the bandit likes; both traded knowingly for time to first token (hold.py). A
    name of its own so the trade is a row of its own in every table, beside the default that
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
