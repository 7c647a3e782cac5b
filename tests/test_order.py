"""When Feather leaves the engine's order (policies/order.py): each reason grouping can pay, on
hand-built queues whose verdict can be worked out on paper, then the measured-profile loss it
removes, end to end in the simulator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.workloads import SharedPrefixWorkload
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.fcfs import FCFSPolicy
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.features import decision_state
from feather_sched.policies.grouped import GroupedPolicy
from feather_sched.policies.order import IDLE_SHARE, GroupingJudge, _Wave
from test_policies import FakeView

MEASURED = StepCostModel("h200", "llama-3.1-8b")
FREE_L2 = StepCostModel("h100-free-l2", "llama-3.1-8b")


class BudgetView(FakeView):
    """A FakeView whose host says its token budget, and counts preemptions."""

    def __init__(self, budget: int = 8192, **kw) -> None:
        super().__init__(**kw)
        self.max_num_batched_tokens = budget
        self.num_preemptions = 0


def _groups(view: FakeView, groups: int, members: int, prefix: int, output: int = 256) -> None:
    """`groups` prefixes of `prefix` tokens, `members` requests each, interleaved in the queue
    (a shuffled arrival order), each with a 16-token suffix of its own."""
    rng = np.random.default_rng(0)
    prefixes = [rng.integers(0, 30_000, prefix) for _ in range(groups)]
    for m in range(members):
        for g in range(groups):
            suffix = np.arange(16) + 40_000 + 16 * (m * groups + g)
            view.add(f"g{g}m{m}", np.r_[prefixes[g], suffix], output_len=output)


def _with_running(groups: int, members: int, running: int) -> BudgetView:
    """`groups` x `members` over 2,048-token prefixes, the first `running` members of every
    group but the last four (when there are more than 16 groups) running."""
    view = BudgetView()
    _groups(view, groups, members, 2048)
    admitted = groups - 4 if groups > 16 else groups
    for m in range(running):
        for g in range(admitted):
            view.admit(f"g{g}m{m}")
    return view


def test_a_burst_of_long_uncached_prefixes_is_grouped() -> None:
    """Empty batch, 20 groups of 8,000-token prefixes: the engine's order needs ~20 prefills
    to fill 256 slots (~20 steps at 8,192 tokens), so the slots idle ~4% of their lives."""
    view = BudgetView()
    _groups(view, 20, 50, 8000, output=50)
    judge = GroupingJudge(MEASURED)
    assert judge.idle_share(view) > 10 * IDLE_SHARE
    assert judge.grouping_pays(view)


def test_a_burst_whose_prefixes_the_host_still_caches_gains_nothing_from_grouping() -> None:
    """The same burst once a wave has drained: nothing runs, but the host's prefix cache
    still holds every group's prefix (SGLang's radix tree, vLLM's prefix cache), so the
    engine's order refills the slots with suffixes only, as grouped order would; a suffix is
    computed in any order. Half the prefixes cached: half the idle share."""
    view = BudgetView()
    _groups(view, 20, 50, 8000, output=50)
    judge = GroupingJudge(MEASURED)
    uncached = judge.idle_share(view)
    prefix_blocks = 8000 // view.block_size
    for rid in list(view.waiting_ids()):
        if int(rid[1 : rid.index("m")]) % 2 == 0:  # the even groups
            view._cached[rid] = prefix_blocks
    assert judge.idle_share(view) == pytest.approx(uncached / 2, rel=0.01)
    for rid in list(view.waiting_ids()):
        view._cached[rid] = prefix_blocks
    assert judge.idle_share(view) == 0.0


class ProbeCounting(BudgetView):
    """A BudgetView that counts its prefix-cache probes."""

    probes = 0

    def cached_blocks(self, request_id: str) -> int:
        self.probes += 1
        return super().cached_blocks(request_id)


@settings(max_examples=60, deadline=None)
@given(
    groups=st.integers(1, 12),
    members=st.integers(1, 6),
    running=st.integers(0, 3),
    prefix=st.sampled_from([64, 512, 2048, 8000]),
    cached=st.lists(st.integers(0, 130), min_size=12, max_size=12),
    budget=st.sampled_from([512, 2048, 8192]),
    threshold=st.floats(0.0, 0.2),
)
def test_the_verdict_probing_only_while_open_matches_the_full_share(
    groups, members, running, prefix, cached, budget, threshold
) -> None:
    """`idle_share_reaches` gives `idle_share(view) >= threshold` on any queue, with at most
    as many cache probes (each a real radix match in SGLang), and none where the share with
    every prefix uncached is already under the threshold."""
    view = ProbeCounting(budget=budget)
    _groups(view, groups, members, prefix, output=64)
    for m in range(min(running, members)):
        for g in range(0, groups, 2):
            view.admit(f"g{g}m{m}")
    for rid in list(view.waiting_ids()):
        view._cached[rid] = cached[int(rid[1 : rid.index("m")])] * prefix // 100 // 16
    judge = GroupingJudge(MEASURED)
    full = judge.idle_share(view)
    probes, view.probes = view.probes, 0
    assert judge.idle_share_reaches(view, threshold) == (full >= threshold)
    assert view.probes <= probes
    wave = _Wave.ahead(view)
    if not isinstance(wave, float):  # the chains bound the open prefixes' prefill from above
        (_, chains), (_, uncached), *_ = wave.bounds()
        assert chains >= uncached
    for rid in list(view.waiting_ids()):
        view._cached[rid] = 0
    if judge.idle_share(view) < threshold:
        view.probes = 0
        assert not judge.idle_share_reaches(view, threshold)
        assert view.probes == 0


def test_a_clear_verdict_probes_few_prefixes_or_none() -> None:
    """20 uncached 8,000-token prefixes (an idle share over 10x the threshold): two probes
    find enough uncached prefill to settle it, not 20; under a threshold above the share with
    every prefix uncached, no probe at all."""
    view = ProbeCounting()
    _groups(view, 20, 50, 8000, output=50)
    judge = GroupingJudge(MEASURED)
    assert judge.idle_share_reaches(view, IDLE_SHARE)
    assert view.probes == 2
    full = judge.idle_share(view)
    view.probes = 0
    assert not judge.idle_share_reaches(view, 1.01 * full)
    assert view.probes == 0


@pytest.mark.parametrize(("output", "walks"), [(4096, False), (8, True)])
def test_long_outputs_settle_the_verdict_without_walking_the_wave(
    output: int, walks: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outputs long next to the prefill the free slots wait for: the wave's whole chains
    already leave the idle share under the threshold, so no request's path in the CHT is
    walked for its shared prefix (`shared_prefix`); with short outputs the same queue needs
    the walk. The verdict is the full share's either way."""
    view = BudgetView()
    _groups(view, 8, 6, 512, output=output)
    judge = GroupingJudge(MEASURED)
    full = judge.idle_share(view)
    walked: list[str] = []
    shared_prefix = view.index.shared_prefix
    monkeypatch.setattr(
        view.index, "shared_prefix", lambda rid: walked.append(rid) or shared_prefix(rid)
    )
    assert judge.idle_share_reaches(view, IDLE_SHARE) == (full >= IDLE_SHARE)
    assert bool(walked) == walks


def test_a_nearly_full_batch_with_cached_prefixes_keeps_the_engine_order() -> None:
    """Every prefix already runs; 16 slots free: the engine's order fills them with 16-token
    suffixes in one step, so grouping cannot grow the batch, and on the measured H200 a mixed
    batch of 2,048-token prefixes decodes no slower (no locality to gain either)."""
    view = _with_running(64, 5, 4)
    judge = GroupingJudge(MEASURED)
    assert view.num_running == 240
    assert judge.idle_share(view) < IDLE_SHARE
    assert judge.locality_gain(view) < 1.02
    assert not judge.grouping_pays(view)
    # without a cost model nothing says grouping cannot pay
    assert GroupingJudge(None).grouping_pays(view)


def test_locality_pays_where_the_cost_model_says_so() -> None:
    """16 groups of 40 over 2,048-token prefixes, 240 running: a full batch spans 16 prefixes
    in the engine's mix, 7 grouped. On the measured H200 neither fits the usable L2 (a mixed
    batch decodes no slower); were L2 reuse free (h100-free-l2), 7 prefixes mostly would."""
    view = _with_running(16, 40, 15)
    assert GroupingJudge(MEASURED).locality_gain(view) < 1.02
    assert not GroupingJudge(MEASURED).grouping_pays(view)
    assert GroupingJudge(FREE_L2).locality_gain(view) >= 1.02
    assert GroupingJudge(FREE_L2).grouping_pays(view)


def test_locality_counts_groups_decoded_apart_where_one_batch_holds_them_all() -> None:
    """Two groups of 100 over 8,000-token prefixes, two members of the first running: one batch
    of 256 holds the whole queue, so a batch grouped at its size holds both prefixes too. A
    STOP decodes them apart instead, each alone at half the size: on h100-free-l2 one prefix
    fits the usable L2 and two do not, so decoding apart pays per token; on the measured H200
    a half-size batch pays its weights twice for a locality that is not there."""
    view = BudgetView()
    _groups(view, 2, 100, 8000, output=50)
    view.admit("g0m0")
    view.admit("g0m1")
    assert GroupingJudge(FREE_L2).locality_gain(view) >= 1.02
    assert GroupingJudge(FREE_L2).grouping_pays(view)
    assert GroupingJudge(MEASURED).locality_gain(view) < 1.02
    assert not GroupingJudge(MEASURED).grouping_pays(view)


def test_locality_counts_only_where_the_host_overlaps_its_cpu() -> None:
    """The same queue as above, where locality pays on h100-free-l2: a synchronous host
    (`overlaps_cpu` False) pays the grouped batch's scattered per-request CPU on the step's
    clock, so locality alone no longer makes grouping pay there; filling idle slots and KV
    capacity still do."""
    view = _with_running(16, 40, 15)
    judge = GroupingJudge(FREE_L2)
    assert judge.locality_gain(view) >= 1.02
    view.overlaps_cpu = True
    assert judge.grouping_pays(view)
    view.overlaps_cpu = False
    assert not judge.grouping_pays(view)
    view.num_preemptions = 1
    assert judge.grouping_pays(view)  # KV binds: grouped order, sync or not
    burst = BudgetView()
    _groups(burst, 20, 50, 8000, output=50)
    burst.overlaps_cpu = False
    assert judge.grouping_pays(burst)  # the idle slots of a burst of long prefixes


def test_stop_is_explored_except_on_a_synchronous_host_under_a_gpu_model() -> None:
    """A STOP's extra steps carry a synchronous host's CPU, which a GPU model's prior does
    not price: no exploratory STOP there. Without a model, on a sequential kernel's model,
    or where the host overlaps, STOP is explored as before."""
    view = _with_running(16, 40, 15)
    sequential = StepCostModel("cpu", "kv-bound")  # vLLM's CPU build: a sequential kernel
    assert sequential.order_sensitive and not MEASURED.order_sensitive
    for overlap in (None, True, False):
        view.overlaps_cpu = overlap
        assert GroupingJudge(None).explores_stop(view)
        assert GroupingJudge(sequential).explores_stop(view)
        assert GroupingJudge(MEASURED).explores_stop(view) is (overlap is not False)


def test_feather_asks_its_bandit_to_explore_only_where_the_judge_allows() -> None:
    """The wiring: a candidate opening a new group is decided with exploration on where the
    host overlaps and off on a synchronous host (the measured GPU model)."""
    view = _with_running(20, 10, 2)  # groups 16-19 wait, none of them running
    policy = FeatherPolicy(cost=MEASURED, kv_gate=False)
    asked: list[bool] = []
    decide = policy.decide

    def spy(state, prior=None, explore=True):
        asked.append(explore)
        return decide(state, prior, explore)

    policy.decide = spy  # type: ignore[method-assign]
    for overlap in (True, False):
        view.overlaps_cpu = overlap
        policy.begin_step(view)
        policy.accept(view, "g19m0")
    assert asked == [True, False]


def test_the_simulator_says_whether_it_overlaps() -> None:
    """`EngineConfig.async_scheduling` is the simulated host's loop: the judge reads it."""
    from feather_lab.sim.engine import Simulator

    for overlap in (True, False):
        sim = Simulator(FCFSPolicy(), MEASURED, EngineConfig(async_scheduling=overlap))
        assert sim.overlaps_cpu is overlap


def test_a_preemption_makes_kv_capacity_binding_for_a_while() -> None:
    view = _with_running(64, 5, 4)
    judge = GroupingJudge(MEASURED)
    assert not judge.grouping_pays(view)
    view.num_preemptions = 1
    assert judge.grouping_pays(view)
    for _ in range(100):
        judge.observe()
    assert not judge.grouping_pays(view)


def test_a_host_without_a_token_budget_keeps_grouped_order() -> None:
    view = FakeView()
    _groups(view, 4, 4, 256)
    assert GroupingJudge(MEASURED).idle_share(view) == 1.0


def test_shared_prefix_on_the_measured_profile_is_no_longer_a_loss() -> None:
    """benchmarks/sim/README.md: grouped order runs SGLang's shared-prefix shape (64 x 16,
    2,048-token
    prompts) at 0.987x FCFS on the measured H200 (prefills bunched into compute-bound steps);
    Feather takes the engine's order where grouping cannot pay."""
    reqs = SharedPrefixWorkload().generate(0)
    cfg = EngineConfig()
    fcfs = simulate(reqs, FCFSPolicy(), MEASURED, cfg).output_tok_s
    grouped = simulate(reqs, GroupedPolicy(), MEASURED, cfg).output_tok_s
    policy = FeatherPolicy(cost=MEASURED)
    feather = simulate(reqs, policy, MEASURED, cfg).output_tok_s
    assert grouped < 0.99 * fcfs  # the loss, as recorded
    assert feather >= 0.995 * fcfs


def _minority_beside_a_batch() -> tuple[BudgetView, FeatherPolicy]:
    """Two groups of 40 over 8,000-token prefixes: 20 of the first running, and one member of
    the second beside them (a minority group); a Feather on the free-L2 profile."""
    view = BudgetView()
    _groups(view, 2, 40, 8000, output=50)
    for m in range(20):
        view.admit(f"g0m{m}")
    view.admit("g1m0")
    return view, FeatherPolicy(cost=FREE_L2)


def test_a_minority_group_is_asked_in_grouped_order_only() -> None:
    """A group one member of which runs beside a batch of another (let in by a bound, not by
    a decision to mix) is asked ADD or STOP in grouped order, and only confident STOPs hold it
    back; in the engine's order it joins unasked, as a STOP there holds up the queue."""
    view, policy = _minority_beside_a_batch()
    state = decision_state(view.index, "g1m1")
    assert state.new_chunks == 0 and not state.joins_majority
    assert policy.asks(state, grouped=True)
    assert not policy.asks(state, grouped=False)
    assert not policy._explores(view, state)


def test_a_minority_groups_verdict_holds_for_the_rest_of_its_step() -> None:
    """Members of a minority group asked in one step get the first one's verdict without a
    new table choice (each would learn nothing the first did not), and are counted as
    decisions; the next step asks the table again."""
    view, policy = _minority_beside_a_batch()
    policy.begin_step(view)
    first, second = (decision_state(view.index, f"g1m{m}") for m in (1, 2))
    assert first.group_bins() == second.group_bins() and not second.joins_majority
    table_choices = policy.learner.total_decisions
    verdicts = [policy._verdict(view, s, rid) for s, rid in ((first, "g1m1"), (second, "g1m2"))]
    assert verdicts[0] == verdicts[1]
    assert policy.learner.total_decisions == table_choices + 1
    assert policy.decisions == 2
    policy.begin_step(view)
    policy._verdict(view, second, "g1m2")
    assert policy.learner.total_decisions == table_choices + 2
