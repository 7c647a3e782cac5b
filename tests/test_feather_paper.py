"""`feather-paper`: the authors' bandit, point by point, on hand-made cases.

Every expected decision below is derived from their code (sethigeet/gpu-mem-bandwidth-
experiments: contextual_bandit.py, policy_request_queues.py `ChunkedHashTreeBanditRequestQueue`,
chunked_hash_tree_rl.cpp); the derivation is in each test's comments. Letters are 50-token
chunks (`paper_cases.prompt`): "ABC" holds three, and "AB" is a prefix of it.
"""

from __future__ import annotations

import math

import pytest

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.workloads import LongPrefixWorkload
from feather_sched.cost import StepCostModel
from feather_sched.policies.feather_paper import FeatherPaperPolicy, PaperBandit, paper_state
from feather_sched.policies.registry import make_policy
from paper_cases import PaperHost, prompt

ADD, STOP = True, False


def _prefer_stop(policy: FeatherPaperPolicy, state) -> None:
    """Train one state so that STOP wins there (ADD: 1 pull of reward 10; STOP: 1 of 1000)."""
    policy.bandit.update(state, ADD, 10.0)
    policy.bandit.update(state, STOP, 1000.0)


def test_order_with_nothing_running_is_shortest_first_and_never_queue_order() -> None:
    host, policy = PaperHost(), FeatherPaperPolicy()
    for rid, chunks in (("a", "ABC"), ("b", "DE"), ("c", "FG")):
        host.arrive(rid, prompt(chunks))
    # Nothing active: missing = chunk count, so b (2, enqueued before c) first; empty batch:
    # ADD, unrecorded. Then c misses 2 (F, FG) and a 3: c. Its loss is the whole chain of b
    # (before 2, after 0): state (0, 2, 0), both arms untried -> ADD (inf >= inf). Then a:
    # the chain common to b and c is empty, before = after = 0: not the shortcut, the bandit:
    # state (0, 0, 0) -> ADD. No fallback to the queue order a, b, c.
    assert host.step(policy) == [("b", ADD), ("c", ADD), ("a", ADD)]
    assert policy.pending == [((0, 2, 0), ADD), ((0, 0, 0), ADD)]


def test_order_is_fewest_missing_chunks_not_deepest_match() -> None:
    host, policy = PaperHost(), FeatherPaperPolicy()
    host.run("r", prompt("ABCD"))
    for rid, chunks in (("u", "XYZ"), ("v", "ABQ"), ("w", "AW"), ("s", "ABCDE")):
        host.arrive(rid, prompt(chunks))
    # Missing against r's chunks: u 3, v 1 (ABQ), w 1 (AW), s 1 (ABCDE). Ties by enqueue
    # order: v, although s matches four chunks. After v: w and s still miss 1 -> w, then s,
    # then u. (Every state here is untried or the shortcut, so every answer is ADD.)
    assert [rid for rid, _ in host.step(policy)] == ["v", "w", "s", "u"]


def test_sharing_nothing_goes_to_the_bandit_which_may_stop() -> None:
    host, policy = PaperHost(), FeatherPaperPolicy()
    host.run("r1", prompt("AB"))
    host.run("r2", prompt("CD"))
    host.arrive("x", prompt("EF"))
    # r1 and r2 share nothing: chunks_before = 0 = chunks_after. Not the shortcut (it needs
    # before > 0): state (2 // 4, 0, 0) = (0, 0, 0) goes to UCB, trained to STOP here.
    _prefer_stop(policy, (0, 0, 0))
    assert host.step(policy) == [("x", STOP)]
    assert policy.pending == [((0, 0, 0), STOP)] and policy.stops == 1


def test_shortcut_adds_when_the_common_prefix_is_kept_and_records_it() -> None:
    host, policy = PaperHost(), FeatherPaperPolicy()
    host.run("r", prompt("ABC"))
    host.arrive("y", prompt("ABCD"))
    # before = 3 = after > 0: ADD whatever the bandit says of the state, and the ADD is
    # recorded in state (0, 0, 1 // 4 = 0) (y itself holds the kept level): the same state
    # the "nothing shared" case above asks the bandit in.
    _prefer_stop(policy, (0, 0, 0))
    assert host.step(policy) == [("y", ADD)]
    assert policy.pending == [((0, 0, 0), ADD)]


def test_state_bins_and_the_third_feature_at_the_kept_level() -> None:
    host, policy = PaperHost(), FeatherPaperPolicy()
    host.run("r", prompt("ABCDEFGHI"))
    for i in range(5):
        host.arrive(f"p{i}", prompt("AB" + "stuvw"[i]))
    host.arrive("z", prompt("Z"))
    # p0: before 9, after 2: loss 7 clipped to 5; waiting requests holding level 1 of the
    # chain ("AB"): p0..p4 = 5, the candidate included -> 5 // 4 = 1. State (0, 5, 1).
    # p1: the chain is now AB (r and p0): before = after = 2, the shortcut, 4 waiting: (0,0,1).
    # z (missing 1, enqueued last) keeps nothing: after 0, so its third feature is 0.
    host.step(policy)
    states = [s for s, _ in policy.pending]
    assert states[:2] == [(0, 5, 1), (0, 0, 1)]
    assert states[-1] == (1, 2, 0)  # batch 6 -> 1; loss 2 (chain AB); nothing kept -> 0
    assert paper_state(45, 3, 10, 50) == (10, -5, 10)


def test_pulls_count_at_feedback_so_a_pass_keeps_adding() -> None:
    host, policy = PaperHost(), FeatherPaperPolicy()
    host.run("r", prompt("AB"))
    for rid in ("c1", "c2", "c3"):
        host.arrive(rid, prompt("C" + rid[1]))
    # c1: loss 2 (0, 2, 0) untried -> ADD. c2, c3: the chain of r and c1 is empty, state
    # (0, 0, 0) both times, untried both times -> ADD, ADD: had the first ADD counted as a
    # pull, STOP (untried, inf) would have won the second.
    assert [add for _, add in host.step(policy, step_time=0.5)] == [ADD, ADD, ADD]
    assert policy.bandit.pulls == {} and policy.bandit.total_steps == 0
    # Next pass, first question: reward = running count at the last decision (3: r, c1, c2)
    # / time between the scheduler calls (0.5 s) = 6 to each of the three decisions.
    host.arrive("d", prompt("D"))
    host.step(policy)
    bandit = policy.bandit
    assert bandit.total_steps == 3
    assert bandit.pulls[((0, 2, 0), ADD)] == 1 and bandit.rewards[((0, 2, 0), ADD)] == 6.0
    assert bandit.pulls[((0, 0, 0), ADD)] == 2 and bandit.rewards[((0, 0, 0), ADD)] == 12.0
    assert len(policy.pending) == 1  # d's decision waits for the next pass


def test_no_feedback_without_a_step_time() -> None:
    host, policy = PaperHost(), FeatherPaperPolicy()
    host.run("r", prompt("AB"))
    host.arrive("x", prompt("X"))
    host.step(policy)  # no end_step: their last_batch_time is None -> nothing rewarded
    host.arrive("y", prompt("Y"))
    host.step(policy)
    assert policy.bandit.total_steps == 0 and len(policy.pending) == 2


def test_ucb_is_theirs() -> None:
    bandit = PaperBandit(c=200.0)
    s = (1, 1, 1)
    assert bandit.choose(s) is ADD  # both untried: inf >= inf
    bandit.update(s, ADD, 100.0)
    assert bandit.choose(s) is STOP  # STOP untried
    for _ in range(4):
        bandit.update(s, STOP, 150.0)
    # ADD: 100 + 200 sqrt(ln 6 / 1) = 367.7; STOP: 150 + 200 sqrt(ln 6 / 4) = 283.9
    assert bandit.score(s, ADD) == pytest.approx(100 + 200 * math.sqrt(math.log(6)))
    assert bandit.choose(s) is ADD
    assert PaperBandit(c=0.0).choose(s) is ADD  # a fresh bandit knows nothing
    greedy = PaperBandit(c=0.0)
    greedy.update(s, ADD, 100.0)
    greedy.update(s, STOP, 150.0)
    assert greedy.choose(s) is STOP
    # The log term counts every update, all states: another state's pulls widen this one's.
    before = bandit.score(s, ADD)
    bandit.update((0, 0, 0), ADD, 1.0)
    assert bandit.score(s, ADD) > before
    with pytest.raises(ValueError, match="c must be"):
        FeatherPaperPolicy(c=-1)


def test_a_preempted_request_is_never_offered_again() -> None:
    host, policy = PaperHost(), FeatherPaperPolicy()
    host.arrive("r", prompt("AB"))
    assert host.step(policy) == [("r", ADD)]
    host.index.preempt("r")  # vLLM prepends it; their tree's insert ignores a known id
    host.arrive("x", prompt("CD"))
    # r stays active to the tree: x is the only candidate, and r's chain still counts
    # (before 2, after 0: loss 2, batch 0 -> ADD unrecorded since nothing runs).
    assert host.step(policy) == [("x", ADD)]
    assert host.step(policy) == []  # r waits; only the host's never-stall rule admits it
    assert "r" in policy.tree.stuck and policy.tree.chain == []


def test_runs_every_request_once_and_is_registered() -> None:
    reqs = LongPrefixWorkload(
        num_prefixes=3, prefix_len=4000, requests_per_prefix=40, output_len=20
    ).generate(0)
    policy = make_policy("feather-paper")
    cost = StepCostModel("h100-free-l2", "llama-3-8b")
    result = simulate(reqs, policy, cost, EngineConfig(max_num_seqs=64))
    assert sorted(r.request_id for r in result.records) == sorted(r.request_id for r in reqs)
    assert policy.decisions > 0 and policy.bandit.total_steps > 0


def test_a_pass_that_starts_empty_still_rewards_the_last_one() -> None:
    host, policy = PaperHost(), FeatherPaperPolicy()
    host.run("r", prompt("AB"))
    host.arrive("x", prompt("X"))
    host.step(policy, step_time=0.25)  # x: state (0, 2, 0), ADD, pending
    host.index.finish("r")
    host.index.finish("x")
    host.arrive("y", prompt("Y"))
    # Their gate gives feedback before it looks at the batch: reward 1 / 0.25 = 4 for x's
    # decision, then the empty batch clears the list and ADDs y unrecorded.
    assert host.step(policy) == [("y", ADD)]
    assert policy.bandit.rewards == {((0, 2, 0), ADD): 4.0} and policy.pending == []
