"""`feather-upstream`: the rule of vLLM pull request #42134, point by point, and the invariants
both of the authors' policies must keep through a host (nothing dropped, duplicated or starved).

Expected decisions are derived from the pull request's `FeatherRequestQueue`
(`should_add_more_to_batch`) over the tree of csrc/cpu/scheduler/chunked_hash_tree.cpp; letters
are 50-token chunks (`paper_cases.prompt`).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.workloads import SharedPrefixWorkload
from feather_sched.cost import StepCostModel
from feather_sched.policies.feather_upstream import FeatherUpstreamPolicy
from feather_sched.policies.registry import make_policy, policy_names
from paper_cases import PaperHost, prompt

ADD, STOP = True, False


def test_empty_batch_adds_and_leaves_the_floor() -> None:
    host, policy = PaperHost(), FeatherUpstreamPolicy()
    host.arrive("a", prompt("ABCDEFGH"))
    assert host.step(policy) == [("a", ADD)]
    assert policy.floor == 1 and policy.decisions == 0


def test_within_the_ceiling_adds_and_raises_the_floor_up_to_ten() -> None:
    host, policy = PaperHost(), FeatherUpstreamPolicy()
    host.run("r", prompt("A"))
    for i in range(12):
        host.arrive(f"a{i}", prompt("A", tail=i + 1))
    # Each keeps the common chunk A (before 1, after 1: loss 0 <= 5): ADD, floor + 1; the
    # floor stops at 10.
    assert [add for _, add in host.step(policy)] == [ADD] * 12
    assert policy.floor == 10


def test_beyond_the_ceiling_adds_only_below_the_floor() -> None:
    host, policy = PaperHost(), FeatherUpstreamPolicy()
    host.run("r", prompt("ABCDEFGH"))
    host.arrive("z", prompt("Z"))
    # z keeps nothing of the 8 common chunks: loss 8 > 5; batch 1 is not below floor 1: STOP.
    assert host.step(policy) == [("z", STOP)]
    policy.floor = 3
    # Below a floor of 3 the same candidate is admitted (batch 1 < 3); the common prefix of
    # r and z is then empty, so the next candidate loses nothing: ADD, floor 4.
    host.arrive("y", prompt("Y"))
    assert host.step(policy) == [("z", ADD), ("y", ADD)]
    assert policy.floor == 4


def test_the_ceiling_is_seven_when_ten_wait_at_the_kept_level() -> None:
    for waiting, want in ((10, ADD), (9, STOP)):
        host, policy = PaperHost(), FeatherUpstreamPolicy()
        host.run("r", prompt("ABCDEFGH"))
        for i in range(waiting):
            host.arrive(f"p{i}", prompt("AB", tail=i + 1))
        # First candidate p0 keeps AB: loss 8 - 2 = 6. With 10 requests waiting at level AB
        # (p0 included) the ceiling is 7: ADD; with 9 it is 5: beyond, batch 1 not < 1: STOP.
        assert host.step(policy)[0] == ("p0", want)


def test_the_floor_is_never_reset_between_passes() -> None:
    host, policy = PaperHost(), FeatherUpstreamPolicy()
    host.run("r", prompt("ABCDEFGH"))
    for i in range(3):
        host.arrive(f"k{i}", prompt("ABCDEFGH", tail=i + 1))
    assert [add for _, add in host.step(policy)] == [ADD] * 3  # loss 0: floor 4
    for i in range(3):
        host.index.finish(f"k{i}")
    host.arrive("z", prompt("Z"))
    # A later pass: z loses all 8 chunks, batch 1 < floor 4 (kept from the last pass): ADD.
    # A fresh queue (floor 1) stops there.
    assert host.step(policy) == [("z", ADD)]
    fresh = PaperHost()
    fresh.run("r", prompt("ABCDEFGH"))
    fresh.arrive("z", prompt("Z"))
    assert fresh.step(FeatherUpstreamPolicy()) == [("z", STOP)]


def test_order_is_the_trees() -> None:
    host, policy = PaperHost(), FeatherUpstreamPolicy()
    host.run("r", prompt("ABCD"))
    for rid, chunks in (("u", "XYZ"), ("v", "ABQ"), ("w", "AW"), ("s", "ABCDE")):
        host.arrive(rid, prompt(chunks))
    # Fewest missing chunks, ties by enqueue order (as for feather-paper): v, w, s, then u,
    # whose loss (the chain is A by then: 1 chunk) is within the ceiling.
    assert host.step(policy) == [("v", ADD), ("w", ADD), ("s", ADD), ("u", ADD)]


AUTHORS = ["feather-paper", "feather-upstream"]
COST = StepCostModel("h100-free-l2", "llama-3-8b")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(AUTHORS),
    groups=st.integers(1, 4),
    per_group=st.integers(1, 8),
    system=st.integers(30, 260),
    output=st.integers(8, 64),
    kv_blocks=st.integers(22, 60),  # the longest request (340 tokens) fits an empty cache
    max_seqs=st.integers(1, 16),
    seed=st.integers(0, 100),
)
def test_never_drops_duplicates_or_starves(
    name: str,
    groups: int,
    per_group: int,
    system: int,
    output: int,
    kv_blocks: int,
    max_seqs: int,
    seed: int,
) -> None:
    """Every request finishes exactly once with its full output, also when the KV cache is
    small enough to preempt (the authors' tree then never offers the preempted request again:
    the host's never-stall rule admits it once nothing runs)."""
    shape = {"num_groups": groups, "prompts_per_group": per_group, "system_prompt_len": system}
    requests = SharedPrefixWorkload(**shape, question_len=16, output_len=output).generate(seed=seed)
    config = EngineConfig(max_num_seqs=max_seqs, num_kv_blocks=kv_blocks, check_invariants_every=1)
    result = simulate(requests, make_policy(name), COST, config)
    done = [r.request_id for r in result.records]
    assert sorted(done) == sorted(r.request_id for r in requests)
    want = {r.request_id: r.output_len for r in requests}
    assert all(rec.output_len == want[rec.request_id] for rec in result.records)


@pytest.mark.parametrize("name", AUTHORS)
def test_a_preempted_request_waits_for_the_hosts_never_stall_rule(name: str) -> None:
    """Their tree never offers a preempted request again; in the simulator every preemption
    here ends in a forced admission of the queue head once nothing runs (and nothing else)."""
    requests = SharedPrefixWorkload(
        num_groups=2, prompts_per_group=6, system_prompt_len=128, question_len=16, output_len=64
    ).generate(seed=0)
    config = EngineConfig(max_num_seqs=16, num_kv_blocks=16, check_invariants_every=1)
    result = simulate(requests, make_policy(name), COST, config)
    assert len(result.records) == len(requests)
    assert result.preemptions > 0 and result.forced_admissions == result.preemptions
    fcfs = simulate(requests, make_policy("fcfs"), COST, config)
    assert fcfs.preemptions > 0 and fcfs.forced_admissions == 0  # the engine's order needs none


def test_both_are_registered_rows() -> None:
    assert set(AUTHORS) <= set(policy_names())
