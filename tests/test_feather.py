"""The Feather bandit policy: its decisions, its starvation guard, its saved state."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from feather_sched import Request
from feather_sched.index.cht import ChunkedHashTree
from feather_sched.policies.bandit import ADD, STOP, BanditTable, coarse_key
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.features import (
    DecisionState,
    decision_state,
    log2_bin,
    shared_depth,
)
from feather_sched.sim.config import EngineConfig
from feather_sched.sim.cost import StepCostModel
from feather_sched.sim.engine import simulate
from feather_sched.workloads import LongPrefixWorkload, NoSharingWorkload

COST = StepCostModel("h100", "llama-3-8b")


def _stop_everywhere() -> FeatherPolicy:
    """A frozen table that prefers STOP in every state: the worst case for starvation."""
    policy = FeatherPolicy(learn=False, max_wait_s=1e9)
    for b in range(10):
        for lost in range(9):
            for g in range(9):
                policy.table.stats[(b, lost, g)] = [1, 1, 0.0, 1, 1, 1.0]
    return policy


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


def test_bandit_stops_first_waits_for_evidence_then_follows_rewards() -> None:
    table = BanditTable(exploration=0.0)
    key = (1, 2, 3)
    assert table.choose(key, scale=1.0) == STOP  # a new state keeps the batch as it is
    table.pull(key, STOP)
    assert table.choose(key, scale=1.0) == STOP  # STOP's reward has not arrived yet
    table.update(key, STOP, 0.2)
    assert table.choose(key, scale=1.0) == ADD  # now try the other action
    table.pull(key, ADD)
    assert table.choose(key, scale=1.0) == STOP  # an ADD is out: no more mixing until it pays
    table.update(key, ADD, 0.9)
    assert table.choose(key, scale=1.0) == ADD and table.greedy(key) == ADD
    for _ in range(20):
        table.pull(key, STOP)
        table.update(key, STOP, 2.0)
    assert table.choose(key, scale=2.0) == STOP


def test_new_states_back_off_to_their_coarse_state() -> None:
    """A fine state without evidence for both actions decides from (group - batch, lost);
    once it has its own evidence it decides alone."""
    table = BanditTable(exploration=0.0)
    learned = (6, 7, 4)  # 32-63 running, a group 2 bins smaller than the batch
    for action, reward in ((STOP, 1.0), (ADD, 2.0)):
        table.pull(learned, action)
        table.update(learned, action, reward)
    assert coarse_key(learned) == (-2, 7)
    unseen = (8, 7, 6)  # a bigger batch, a group as much smaller: same coarse state
    assert table.choose(unseen, scale=1.0) == ADD and table.greedy(unseen) == ADD
    assert table.choose((8, 7, 8), scale=1.0) == STOP  # another coarse state: STOP first
    for action, reward in ((STOP, 3.0), (ADD, 0.5)):
        table.pull(unseen, action)
        table.update(unseen, action, reward)
    assert table.choose(unseen, scale=1.0) == STOP  # its own evidence now decides
    assert table.stats[coarse_key(unseen)][1] == 2  # and it fed the coarse state too


def test_reward_charges_the_own_step_its_marginal_time() -> None:
    """The decision's own step costs only what its decodes add to its prefill; the next
    `horizon` decode-dominated steps cost their full time; prefill-heavy ones are skipped."""
    policy = FeatherPolicy(horizon=2)
    view = None  # end_step does not read the view
    policy.end_step(view, 1.0, 10, prefill_tokens=990)  # learns 1 ms per token
    key = (3, 7, 4)
    policy.table.stats[key] = [0, 0, 0.0, 0, 0, 0.0]
    policy.decide(decision_state_for(key))
    policy.end_step(view, 1.0, 20, prefill_tokens=980)  # own step: 1.0 - 0.98 = 0.02 s
    policy.end_step(view, 1.0, 20, prefill_tokens=980)  # prefill-dominated: skipped
    policy.end_step(view, 0.1, 20)
    assert policy.table.stats[key][4] == 0  # one decode step of two: no reward yet
    policy.end_step(view, 0.1, 20)
    reward = (20 + 20 + 20) / (0.02 + 0.1 + 0.1)
    assert policy.table.stats[key][5] == pytest.approx(reward)  # a STOP (new state)
    assert policy.reward_scale == pytest.approx(200.0)  # decode steps only


def decision_state_for(bins: tuple[int, int, int]) -> DecisionState:
    """A DecisionState whose bins are `bins` (each value is the smallest of its bin)."""
    values = [0 if b == 0 else 1 << (b - 1) for b in bins]
    return DecisionState(values[0], values[1], values[2], 0, False)


def test_ucb_explores_the_less_tried_action() -> None:
    table = BanditTable(exploration=1.0)
    key = (0, 0, 0)
    for _ in range(50):
        table.pull(key, STOP)
        table.update(key, STOP, 1.0)
    table.pull(key, ADD)
    table.update(key, ADD, 0.9)  # slightly worse, tried once: the bonus favours trying again
    assert table.choose(key, scale=1.0) == ADD


def test_starvation_guard_bounds_waiting() -> None:
    """A stream of group-A requests keeps the batch busy; a lone group-B request would wait
    behind all of them under a STOP-everywhere table, unless the guard admits it."""
    prefix_a = np.random.default_rng(1).integers(0, 1000, 2048).astype(np.int32)
    prefix_b = np.random.default_rng(2).integers(0, 1000, 2048).astype(np.int32)
    reqs = [
        Request(f"a{i}", np.r_[prefix_a, [i % 1000, 7]], 40, arrival_time=0.01 * i)
        for i in range(600)
    ]
    # two B requests, so they have a shared prefix that admitting them would bring in
    reqs += [Request(f"b{j}", np.r_[prefix_b, [j, 2]], 4, arrival_time=0.05) for j in range(2)]
    cfg = EngineConfig(max_num_seqs=32)

    unguarded = simulate(reqs, _stop_everywhere(), COST, cfg)
    b_wait = min(r.ttft for r in unguarded.records if r.request_id.startswith("b"))
    assert b_wait > 3.0  # starved behind the A stream

    guarded_policy = _stop_everywhere()
    guarded_policy.max_wait_s = 0.5
    guarded = simulate(reqs, guarded_policy, COST, cfg)
    b_wait = max(r.ttft for r in guarded.records if r.request_id.startswith("b"))
    assert b_wait < 0.5 + 0.2
    assert guarded_policy.starvation_admits >= 1
    assert len(guarded.records) == len(reqs)


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
    with pytest.raises(ValueError, match="not a version-3 'feather' policy state"):
        FeatherPolicy(policy_state=other)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="horizon"):
        FeatherPolicy(horizon=0)
    with pytest.raises(ValueError, match="max_wait_s"):
        FeatherPolicy(max_wait_s=0)
