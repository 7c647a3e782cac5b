"""`feather-paper`: the paper's bandit as published (state, reward and UCB pinned)."""

from __future__ import annotations

import numpy as np
import pytest

from feather_sched.cost import StepCostModel
from feather_sched.index.cht import ChunkedHashTree
from feather_sched.policies.feather_paper import ADD, STOP, FeatherPaperPolicy
from feather_sched.policies.registry import make_policy
from feather_sched.sim.config import EngineConfig
from feather_sched.sim.engine import simulate
from feather_sched.workloads import LongPrefixWorkload, NoSharingWorkload

COST = StepCostModel("h100-free-l2", "llama-3-8b")


class _View:
    def __init__(self, index: ChunkedHashTree) -> None:
        self.index = index


def test_state_is_the_papers() -> None:
    """(batch // 4 capped at 10, lost 50-token chunks clipped to 5, same-prefix waiting // 4
    capped at 10); no question when nothing is lost or the batch is empty."""
    cht = ChunkedHashTree(64)
    running = np.arange(1000)
    for i in range(9):
        cht.add(f"r{i}", np.r_[running, [i]])
        cht.admit(f"r{i}")
    other = np.arange(5000, 5128)  # two 64-token chunks = 128 tokens = 2 paper chunks
    for j in range(6):
        cht.add(f"w{j}", np.r_[other, [j] * 64])
    policy = FeatherPaperPolicy()
    assert policy.accept(_View(cht), "w0") is True  # ADD is tried first
    assert list(policy.stats) == [(2, 2, 1)]
    cht.add("same", np.r_[running, [77]])
    assert policy.accept(_View(cht), "same") is True and policy.decisions == 1


def test_ucb_tries_each_action_then_follows_c() -> None:
    policy = FeatherPaperPolicy(c=0.0)
    key = (1, 1, 1)
    assert policy._ucb(key) == ADD
    policy.stats[key][ADD] = [1, 1, 100.0]
    assert policy._ucb(key) == STOP
    policy.stats[key][STOP] = [1, 1, 150.0]
    assert policy._ucb(key) == STOP  # c = 0: the higher mean
    wide = FeatherPaperPolicy(c=200.0)
    wide.stats[key] = [[1, 1, 100.0], [50, 50, 150.0]]
    assert wide._ucb(key) == ADD  # c = 200 on raw tokens/s: the less tried arm


def test_reward_is_final_batch_over_time_between_calls() -> None:
    policy = FeatherPaperPolicy()
    key = (1, 1, 1)
    policy.stats[key] = [[2, 0, 0.0], [0, 0, 0.0]]
    policy._pending = [(key, ADD), (key, ADD)]
    policy.end_step(None, step_time=0.5, batch_size=30)  # 60 tokens/s to both decisions
    assert policy.stats[key][ADD] == [2, 2, pytest.approx(60.0)]
    assert policy._pending == []


def test_runs_every_request_once_and_is_registered() -> None:
    reqs = LongPrefixWorkload(
        num_prefixes=3, prefix_len=4000, requests_per_prefix=40, output_len=20
    ).generate(0)
    policy = make_policy("feather-paper")
    result = simulate(reqs, policy, COST, EngineConfig(max_num_seqs=64))
    assert sorted(r.request_id for r in result.records) == sorted(r.request_id for r in reqs)
    assert policy.decisions > 0
    quiet = FeatherPaperPolicy()
    simulate(
        NoSharingWorkload(num_requests=20, prompt_len=300, output_len=4).generate(0),
        quiet,
        COST,
        EngineConfig(max_num_seqs=8),
    )
    assert quiet.decisions == 0
    with pytest.raises(ValueError, match="c must be"):
        FeatherPaperPolicy(c=-1)
