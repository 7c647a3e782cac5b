"""The Feather bandit policy: its decisions, its starvation guard, its saved state."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.workloads import LongPrefixWorkload, NoSharingWorkload
from feather_sched import Request
from feather_sched.cost import StepCostModel
from feather_sched.index.cht import ChunkedHashTree
from feather_sched.policies.bandit import ADD, STOP, Arm, BanditTable, coarse_key, combine
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.features import (
    DecisionState,
    decision_state,
    log2_bin,
    shared_depth,
)
from feather_sched.policies.hold import STOP_DELAY_SHARE
from feather_sched.policies.registry import make_policy

COST = StepCostModel("h100-free-l2", "llama-3-8b")


def _stop_everywhere(stop_delay_share: float | None = None, stop: float = 1.0) -> FeatherPolicy:
    """A frozen table that prefers STOP in every state, its holds unbounded (and its STOPs,
    unless `stop_delay_share` is given): the worst case for starvation. ADD's mean reward is
    0 and STOP's `stop` tokens/s, so against the throughputs the engine reaches STOP's lead
    is a sliver unless `stop` is huge."""
    policy = FeatherPolicy(
        learn=False, max_wait_s=1e9, max_hold_steps=None, stop_delay_share=stop_delay_share
    )
    for b in range(10):
        for lost in range(9):
            for g in range(9):
                policy.table.stats[(b, lost, g)] = (_arm(0.0), _arm(stop))
    return policy


def _arm(mean: float, n: int = 10, sd: float = 0.01) -> Arm:
    """An arm with `n` rewards around `mean` (sample standard deviation `sd`)."""
    return Arm(pulls=n, n=n, mean=mean, m2=sd * sd * (n - 1))


def _reward(table: BanditTable, key, action: int, reward: float) -> None:
    table.pull(key, action)
    table.update(key, action, reward)


def test_log_bins() -> None:
    assert [log2_bin(v, 9) for v in (0, 1, 2, 3, 4, 7, 8, 10_000)] == [0, 1, 2, 2, 3, 3, 4, 9]


def test_decision_state_from_the_index() -> None:
    cht = ChunkedHashTree(4)
    a = np.arange(16)
    cht.add("run", np.r_[a, [90, 91, 92, 93]])
    cht.admit("run")
    cht.add("same_group", np.r_[a, [80, 81, 82, 83]])  # joins the running prefix
    b = np.arange(100, 116)
    cht.add("new1", np.r_[b, [1, 2, 3, 4]])  # a new 4-chunk prefix shared by two waiting
    cht.add("new2", np.r_[b, [5, 6, 7, 8]])
    cht.add("loner", np.arange(200, 220))  # shares nothing with anyone
    assert shared_depth(cht, "new1") == 4
    s = decision_state(cht, "same_group")
    assert (s.batch, s.lost_chunks, s.matched_chunks) == (1, 0, 4)
    s = decision_state(cht, "new1")
    assert (s.lost_chunks, s.group, s.matched_chunks) == (4, 2, 0)
    assert decision_state(cht, "loner").lost_chunks == 0


def test_bandit_adds_until_stop_wins_with_confidence() -> None:
    """ADD, the engine's own behaviour, is played without evidence (no budget) and while
    STOP's lead is within its confidence bound; STOP once it wins with confidence."""
    table = BanditTable(confidence=1.0)
    key = (1, 2, 3)
    assert table.choose(key, scale=1.0, budget=0.0).action == ADD  # cold, nothing to spend
    for r in (1.0, 1.1, 0.9):
        _reward(table, key, ADD, r)
    for r in (1.5, 0.6, 1.2):  # mean 1.1 vs 1.0, but noisy: not proven
        _reward(table, key, STOP, r)
    assert table.greedy(key) == ADD
    for r in (1.3, 1.25, 1.35, 1.3, 1.28, 1.32):  # a clear lead now
        _reward(table, key, STOP, r)
    assert table.greedy(key) == STOP
    assert table.choose(key, scale=1.0, budget=0.0) == table.choose(key, 1.0, 5.0)
    assert table.choose(key, scale=1.0, budget=0.0).exploring is False


def test_exploration_is_paid_from_the_budget() -> None:
    """An untried STOP is tried twice at `untried_cost`, then ADD gathers its rewards; a
    STOP proven worse is never tried again, an uncertain one costs ADD's lead over its LCB."""
    table = BanditTable(confidence=1.0)
    key = (3, 4, 5)
    assert table.choose(key, scale=1.0, budget=0.4, untried_cost=0.5).action == ADD
    choice = table.choose(key, scale=1.0, budget=0.5, untried_cost=0.5)
    assert (choice.action, choice.exploring, choice.cost) == (STOP, True, 0.5)
    table.pull(key, STOP)
    table.pull(key, STOP)
    assert table.choose(key, scale=1.0, budget=9.0).action == ADD  # STOP tried enough
    for r in (1.0, 1.02, 0.98):
        _reward(table, key, ADD, r)
    for r in (1.1, 0.9, 1.0):  # no better, no worse, within the noise
        table.update(key, STOP, r)
    gain, se = table.advantage(key, 1.0)
    choice = table.choose(key, scale=1.0, budget=9.0)
    assert choice.exploring and choice.cost == pytest.approx(se - gain)
    assert table.choose(key, scale=1.0, budget=0.0).action == ADD
    for r in (0.5, 0.52, 0.48, 0.5, 0.5):  # now clearly worse
        _reward(table, key, STOP, r)
    assert table.choose(key, scale=1.0, budget=100.0).action == ADD


@pytest.mark.parametrize("forget", [None, 64])
def test_an_arm_no_longer_played_is_sampled_again(forget: int | None) -> None:
    """The live server's case: ADD's rewards all from one early burst, then STOP confident.
    Without fading ADD is never played again; with it, ADD's evidence fades below what the
    test needs and ADD is played (and rewarded) again within about a hundred decisions."""
    table = BanditTable(confidence=1.0, forget=forget)
    key = (8, 6, 4)
    for r in np.random.default_rng(0).normal(789.0, 65.0, 16):
        _reward(table, key, ADD, float(r))
    for r in (970.0, 974.0):
        _reward(table, key, STOP, r)
    scale, first_add = 1352.0, None
    for i in range(400):
        action = table.choose(key, scale, budget=0.0).action
        _reward(table, key, action, 1150.0 if action == ADD else 1110.0 + (i % 3))
        if action == ADD and first_add is None:
            first_add = i
    if forget is None:
        assert first_add is None  # locked in by the first burst's evidence
    else:
        assert first_add is not None and first_add < 150
        assert table.greedy(key, scale) == ADD  # fresh evidence: STOP does not win now


def test_fading_keeps_the_mean_and_shrinks_the_evidence() -> None:
    arm = Arm()
    for r in (1.0, 2.0, 4.0):
        arm.add(r)
    mean, var = arm.mean, arm.var()
    arm.fade(0.5)
    assert arm.mean == mean and arm.n == 1.5 and arm.pulls == 0
    assert arm.var() == pytest.approx(var * 0.5 * 2 / 0.5)  # m2 halved over n - 1 = 0.5
    arm.add(3.0)  # a weighted Welford step: the weighted mean of the rewards so far
    assert arm.mean == pytest.approx((0.5 * (1 + 2 + 4) + 3.0) / 2.5)
    with pytest.raises(ValueError, match="forget"):
        BanditTable(forget=0)


def test_new_states_back_off_to_their_coarse_state() -> None:
    """A fine state without two rewards for both actions decides from (group - batch,
    lost); once it has its own evidence it decides alone."""
    table = BanditTable(confidence=1.0)
    learned = (6, 7, 4)  # 32-63 running, a group 2 bins smaller than the batch
    for r in (1.0, 1.01, 0.99):
        _reward(table, learned, STOP, r)
        _reward(table, learned, ADD, 2 * r)
    assert coarse_key(learned) == (-2, 7)
    unseen = (8, 7, 6)  # a bigger batch, a group as much smaller: same coarse state
    assert table.arms(unseen) is table.stats[(-2, 7)]
    assert table.greedy(unseen) == ADD
    for r in (3.0, 3.1, 2.9):
        _reward(table, unseen, STOP, r)
        _reward(table, unseen, ADD, r / 6)
    assert table.greedy(unseen) == STOP  # its own evidence now decides
    # and it fed the coarse state too: 6 rewards, faded by the 12 decisions since the first
    assert 6 * table.keep**12 < table.stats[coarse_key(unseen)][STOP].n < 6


def test_arm_moments_match_numpy() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(3.0, 0.5, 50)
    arm = Arm()
    for v in values:
        arm.add(float(v))
    assert arm.mean == pytest.approx(values.mean())
    assert arm.var() == pytest.approx(values.var(ddof=1))


def test_reward_charges_the_own_step_its_marginal_time() -> None:
    """The decision's own step costs only what its decodes add to its prefill; the next
    `horizon` decode-dominated steps cost their full time; prefill-heavy ones are skipped."""
    policy = FeatherPolicy(horizon=2)
    view = None  # end_step does not read the view
    policy.end_step(view, 1.0, 10, prefill_tokens=990)  # learns 1 ms per token
    key = (3, 7, 4)
    policy.decide(decision_state_for(key))  # cold: the initial budget pays for a STOP
    policy.end_step(view, 1.0, 20, prefill_tokens=980)  # own step: 1.0 - 0.98 = 0.02 s
    policy.end_step(view, 1.0, 20, prefill_tokens=980)  # prefill-dominated: skipped
    policy.end_step(view, 0.1, 20)
    assert policy.table.stats[key][STOP].n == 0  # one decode step of two: no reward yet
    policy.end_step(view, 0.1, 20)
    reward = (20 + 20 + 20) / (0.02 + 0.1 + 0.1)
    assert policy.table.stats[key][STOP].mean == pytest.approx(reward)
    assert policy.reward_scale == pytest.approx(200.0)  # decode steps only


def decision_state_for(bins: tuple[int, int, int]) -> DecisionState:
    """A DecisionState whose bins are `bins` (each value is the smallest of its bin)."""
    values = [0 if b == 0 else 1 << (b - 1) for b in bins]
    return DecisionState(values[0], values[1], values[2], 0, False, depth=values[1])


def test_budget_grows_with_rewards_and_is_spent_on_exploration() -> None:
    """An untried STOP in a batch of B, holding back a waiting group of G, is charged
    G/(B+G): the most leaving the group out can cost a step's throughput."""
    policy = FeatherPolicy(alpha=0.1, initial_budget=0.5)
    assert policy.decide(decision_state_for((3, 7, 4))) == ADD  # B=4, G=8: 0.67 > 0.5
    assert policy.explorations == 0
    policy.budget = 0.3
    key = (3, 7, 1)  # batch 4, a group of one: an untried STOP costs 0.2
    assert policy.decide(decision_state_for(key)) == STOP
    assert policy.budget == pytest.approx(0.1) and policy.explorations == 1
    assert policy.decide(decision_state_for(key)) == ADD  # 0.1 left: not enough
    for _ in range(8):
        policy.end_step(None, 0.1, 20)  # rewards at the best throughput seen
    assert policy.budget == pytest.approx(0.4)  # alpha of each of the three rewards


def test_no_exploratory_stop_where_explore_is_off() -> None:
    """`explore=False` (a synchronous host under a GPU model, `GroupingJudge.explores_stop`):
    the STOP the budget would pay for is an ADD, and nothing is spent; a confident STOP
    stays a STOP."""
    policy = FeatherPolicy(alpha=0.1, initial_budget=0.5)
    key = (3, 7, 1)  # batch 4, a group of one: an untried STOP costs 0.2
    assert policy.decide(decision_state_for(key), explore=False) == ADD
    assert policy.budget == pytest.approx(0.5) and policy.explorations == 0
    assert policy.decide(decision_state_for(key), prior=(0.5, 0.01), explore=False) == STOP
    assert policy.explorations == 0
    assert policy.decide(decision_state_for(key)) == STOP  # exploring again where allowed
    assert policy.explorations == 1


def _a_stream_and_two_b() -> list[Request]:
    """600 group-A requests arriving 10 ms apart and two group-B requests at 50 ms."""
    prefix_a = np.random.default_rng(1).integers(0, 1000, 2048).astype(np.int32)
    prefix_b = np.random.default_rng(2).integers(0, 1000, 2048).astype(np.int32)
    reqs = [
        Request(f"a{i}", np.r_[prefix_a, [i % 1000, 7]], 40, arrival_time=0.01 * i)
        for i in range(600)
    ]
    # two B requests, so they have a shared prefix that admitting them would bring in
    reqs += [Request(f"b{j}", np.r_[prefix_b, [j, 2]], 4, arrival_time=0.05) for j in range(2)]
    return reqs


def test_starvation_guard_bounds_waiting() -> None:
    """A stream of group-A requests keeps the batch busy; a lone group-B request would wait
    behind all of them under a STOP-everywhere table, unless the guard admits it."""
    reqs = _a_stream_and_two_b()
    cfg = EngineConfig(max_num_seqs=32)

    unguarded = simulate(reqs, _stop_everywhere(), COST, cfg)
    b_wait = min(r.ttft for r in unguarded.records if r.request_id.startswith("b"))
    assert b_wait > 3.0  # starved behind the A stream

    guarded_policy = _stop_everywhere()
    guarded_policy.guard.max_wait_s = 0.5
    guarded = simulate(reqs, guarded_policy, COST, cfg)
    b_wait = max(r.ttft for r in guarded.records if r.request_id.startswith("b"))
    assert b_wait < 0.5 + 0.2
    assert guarded_policy.starvation_admits >= 1
    assert len(guarded.records) == len(reqs)


def test_stop_delay_bounds_what_stops_add_to_the_tail() -> None:
    """The same STOP-everywhere table, with the STOP delay bound: once STOPs have held the
    oldest waiting request back for a fifth of its wait they become ADDs, so no request
    waits far beyond what the steps that were not STOPs made it wait."""
    reqs = _a_stream_and_two_b()
    cfg = EngineConfig(max_num_seqs=32)
    unbounded = simulate(reqs, _stop_everywhere(), COST, cfg)
    policy = _stop_everywhere(stop_delay_share=0.2)
    bounded = simulate(reqs, policy, COST, cfg)
    assert policy.delay.vetoes > 0 and policy.stops > 0
    assert len(bounded.records) == len(reqs)
    b_unbounded = max(r.ttft for r in unbounded.records if r.request_id.startswith("b"))
    b_bounded = max(r.ttft for r in bounded.records if r.request_id.startswith("b"))
    assert b_bounded < b_unbounded / 2
    assert policy.delay.held_s > 0


def test_stops_that_save_more_than_they_hold_are_not_bounded() -> None:
    """STOPs whose lead halves the batch's time or better (`hold.stop_charge`) shorten every
    later wait more than they hold the head back: the bound counts nothing and never vetoes."""
    reqs = _a_stream_and_two_b()
    cfg = EngineConfig(max_num_seqs=32)
    unbounded = simulate(reqs, _stop_everywhere(stop=1e12), COST, cfg)
    policy = _stop_everywhere(stop_delay_share=0.2, stop=1e12)
    bounded = simulate(reqs, policy, COST, cfg)
    assert policy.stops > 0 and policy.delay.vetoes == 0 and policy.delay.held_s == 0
    assert [r.ttft for r in bounded.records] == [r.ttft for r in unbounded.records]


def test_the_stop_delay_bound_is_on_by_default_and_off_in_feather_hold() -> None:
    assert FeatherPolicy().delay.share == STOP_DELAY_SHARE
    assert FeatherPolicy(stop_delay_share=None).delay.share is None
    hold = make_policy("feather-hold")
    assert hold.delay.share is None and hold.hold.max_steps is None


def test_a_confident_stop_carries_its_lead_and_an_exploring_one_none() -> None:
    """The bound nets a STOP step by the lead the table knew when it STOPped: the gain for a
    STOP that wins with confidence, nothing for one taken to learn."""
    table = BanditTable(confidence=1.0)
    key = (3, 2, 4)
    table.stats[key] = (_arm(1.0), _arm(1.3))
    confident = table.choose(key, scale=1.0, budget=0.0)
    assert confident.action == STOP and not confident.exploring
    assert confident.lead == pytest.approx(0.3)
    table.stats[key] = (_arm(1.0), _arm(1.01, sd=0.5))
    exploring = table.choose(key, scale=1.0, budget=10.0)
    assert exploring.action == STOP and exploring.exploring and exploring.lead == 0.0
    policy = FeatherPolicy(learn=False)
    policy.table.stats[key] = (_arm(1.0), _arm(1.3))
    policy.reward_scale = 1.0
    assert policy.decide(decision_state_for(key)) == STOP
    assert policy.stop_lead == pytest.approx(0.3)


def test_learns_to_stop_mixing_long_prefixes() -> None:
    reqs = LongPrefixWorkload(
        num_prefixes=3, prefix_len=8000, requests_per_prefix=60, output_len=30
    ).generate(0)
    policy = FeatherPolicy()
    result = simulate(reqs, policy, COST, EngineConfig(max_num_seqs=128))
    assert policy.decisions > 0 and policy.stops > 0
    assert len(result.records) == len(reqs)
    assert result.steps["groups"].mean() < 2.0


def test_never_asks_without_sharing() -> None:
    reqs = NoSharingWorkload(num_requests=40, prompt_len=300, output_len=8).generate(0)
    policy = FeatherPolicy()
    simulate(reqs, policy, COST, EngineConfig(max_num_seqs=16))
    assert policy.decisions == 0  # nothing shared, so nothing to lose


def test_state_round_trip_and_errors(tmp_path: Path) -> None:
    policy = FeatherPolicy()
    reqs = LongPrefixWorkload(
        num_prefixes=2, prefix_len=4000, requests_per_prefix=30, output_len=20
    ).generate(0)
    simulate(reqs, policy, COST, EngineConfig(max_num_seqs=32))
    path = policy.save(tmp_path / "state.json")
    warm = FeatherPolicy(policy_state=path)
    assert warm.table.stats == policy.table.stats
    assert warm.reward_scale == pytest.approx(policy.reward_scale)
    assert warm.sec_per_token == pytest.approx(policy.sec_per_token)

    with pytest.raises(FileNotFoundError, match="policy state file not found"):
        FeatherPolicy(policy_state=tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad JSON"):
        FeatherPolicy(policy_state=bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"policy": "lpm", "version": 1}))
    with pytest.raises(ValueError, match="not a version-4 'feather' policy state"):
        FeatherPolicy(policy_state=other)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="horizon"):
        FeatherPolicy(horizon=0)
    with pytest.raises(ValueError, match="max_wait_s"):
        FeatherPolicy(max_wait_s=0)
    with pytest.raises(ValueError, match="alpha"):
        FeatherPolicy(alpha=1.0)
    with pytest.raises(ValueError, match="initial_budget"):
        FeatherPolicy(initial_budget=-1)
    with pytest.raises(ValueError, match="stop_delay_share"):
        FeatherPolicy(stop_delay_share=1.5)


def test_precision_weighted_prior_and_data() -> None:
    assert combine((0.0, math.inf), (0.3, 0.1)) == (0.3, 0.1)  # no data: the prior
    assert combine((0.2, 0.1), None) == (0.2, 0.1)
    gain, se = combine((0.0, 0.1), (0.4, 0.1))  # equal precision: the midpoint
    assert gain == pytest.approx(0.2) and se == pytest.approx(0.1 / math.sqrt(2))
    gain, _ = combine((0.0, 0.01), (0.4, 1.0))  # precise data outweighs a vague prior
    assert gain == pytest.approx(0.0, abs=1e-3)


def test_model_prior_decides_the_first_admissions_of_a_burst() -> None:
    """Two long-prefix groups arriving at once, their outputs known (ignore_eos): with the
    hardware's cost model the very first decision keeps the batch homogeneous; without one,
    the table starts from ADD. Known only by their caps, before any output has finished, the
    first decision has nothing to price a 30-token output by: the engine's order, never
    worse."""
    shape = {"num_prefixes": 2, "prefix_len": 8000, "requests_per_prefix": 100, "output_len": 30}
    reqs = LongPrefixWorkload(**shape, ignore_eos=True).generate(0)
    cfg = EngineConfig(max_num_seqs=256)
    informed = FeatherPolicy(cost=COST, max_hold_steps=None)
    result = simulate(reqs, informed, COST, cfg)
    assert informed.stops >= 1 and result.steps["groups"].max() == 1
    summary = result.summary()  # the row reports the policy's own counters
    assert (summary["policy_stops"], summary["policy_decisions"]) == (
        informed.stops,
        informed.decisions,
    )
    plain = simulate(reqs, make_policy("fcfs"), COST, cfg)
    assert result.output_tok_s > 1.3 * plain.output_tok_s
    # The hold bound is the KV gate's: the bandit's STOPs are not cut short by it.
    default = simulate(reqs, FeatherPolicy(cost=COST), COST, cfg)
    assert default.output_tok_s == result.output_tok_s
    capped = LongPrefixWorkload(**shape).generate(0)
    blind = simulate(capped, FeatherPolicy(cost=COST), COST, cfg)
    assert blind.output_tok_s >= simulate(capped, make_policy("fcfs"), COST, cfg).output_tok_s


def test_model_prior_adds_where_batching_pays() -> None:
    """On an overhead-bound engine (the tiny CPU model) a bigger batch always pays: the
    prior never STOPs, so the batch is what the engine's own order gives."""
    reqs = LongPrefixWorkload(
        num_prefixes=4, prefix_len=512, requests_per_prefix=16, output_len=16, vocab_size=512
    ).generate(0)
    cost = StepCostModel("cpu", "tiny-llama")
    policy = FeatherPolicy(cost=cost, initial_budget=0.0)
    cfg = EngineConfig(max_num_seqs=64, block_size=32, index_chunk_size=32)
    simulate(reqs, policy, cost, cfg)
    assert policy.decisions > 0 and policy.stops == 0
    with pytest.raises(ValueError, match="both or neither"):
        make_policy("feather", hardware="h100-free-l2")
