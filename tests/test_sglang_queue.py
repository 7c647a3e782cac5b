"""SGLangQueue without SGLang: the CHT follows the lists by rid, and one lazy admission pass
reorders the list ahead of a scheduler-like `for` loop. The real-SGLang checks are in
test_sglang_integration.py."""

from __future__ import annotations

import copy
import itertools
import random
from array import array
from types import SimpleNamespace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from feather_lab.harness.sglang_loop import StandInReq, kv_need, scheduler_loop
from feather_sched.index.cht import RequestState
from feather_sched.policies.grouped import GroupedPolicy
from feather_sched.sglang.plugin import settings_from_env
from feather_sched.sglang.queue import Offer, SGLangQueue

PREFIX = {g: [1000 * (i + 1) + t for t in range(128)] for i, g in enumerate("ABCD")}


def req(rid: str, group: str, tail: int = 16) -> StandInReq:
    rng = random.Random(rid)
    ids = array("q", PREFIX[group] + [rng.randrange(5000, 30000) for _ in range(tail)])
    return StandInReq(
        rid=rid, origin_input_ids=ids, sampling_params=SimpleNamespace(max_new_tokens=8)
    )


def interleaved(n: int) -> list[StandInReq]:
    return [req(f"{g}{i}", g) for i in range(n) for g in "ABCD"]


def test_pass_orders_by_prefix_group_lazily():
    q = SGLangQueue(GroupedPolicy(), chunk_tokens=32)
    waiting = interleaved(4)
    running = [req("A-run", "A")]
    q.sync([], running)
    q.begin_pass(waiting, running)
    assert waiting[0].rid == "A0"  # the policy's first pick is at the head
    batch = scheduler_loop(q, waiting, fits=5)
    assert [r.rid for r in batch] == ["A0", "A1", "A2", "A3", "B0"]
    assert q.stats.hashed == 17 and q.stats.admitted == 5
    # Feather's next pick (offered, did not fit) leads the rest, which keeps arrival order
    rest = [r.rid for r in waiting if r not in batch]
    assert rest[0] == "B1"
    taken = {b.rid for b in batch} | {"B1"}
    assert rest[1:] == [r.rid for r in interleaved(4) if r.rid not in taken]


def test_unshared_pass_is_left_to_sglang():
    """Nothing shared: the feather policy would take the list as it is, so the pass is
    SGLang's own (no reordering, no questions); once two requests share, Feather drives."""
    from feather_sched.policies.feather import FeatherPolicy

    q = SGLangQueue(FeatherPolicy(), chunk_tokens=32)
    waiting = [req("A0", "A"), req("B0", "B"), req("C0", "C")]
    q.begin_pass(waiting, [])
    assert q.stats.queue_order_steps == 1
    assert [r.rid for r in scheduler_loop(q, waiting, fits=100)] == ["A0", "B0", "C0"]
    waiting = [req("D0", "D"), req("A1", "A"), req("D1", "D")]
    q.begin_pass(waiting, waiting[:0])
    assert q.stats.queue_order_steps == 1  # D0 and D1 share a prefix: the policy decides
    assert [r.rid for r in scheduler_loop(q, waiting, fits=100)] == ["D0", "D1", "A1"]


def test_stop_ends_the_pass_and_never_stalls():
    q = SGLangQueue(GroupedPolicy(max_batch=2), chunk_tokens=32)
    waiting = interleaved(2)
    q.begin_pass(waiting, [])
    batch = scheduler_loop(q, waiting, fits=100)
    assert [r.rid for r in batch] == ["A0", "A1"]
    assert q.stats.stops == 1 and q.stats.forced == 0
    # max_batch=0-like policy: STOP at once while nothing runs -> one forced admission
    q2 = SGLangQueue(GroupedPolicy(max_batch=1), chunk_tokens=32)
    q2.begin_pass(waiting2 := interleaved(1), [req("X", "D")])
    assert scheduler_loop(q2, waiting2, fits=100) == []  # something runs: STOP is kept


def test_sync_tracks_admission_finish_retraction_abort():
    q = SGLangQueue(GroupedPolicy(), chunk_tokens=32)
    reqs = interleaved(2)
    waiting = list(reqs)
    q.sync(waiting, [])
    running = [waiting.pop(0), waiting.pop(0)]  # admitted by someone else
    q.sync(waiting, running)
    q.check(waiting, running)
    assert q.index.state("A0") is RequestState.RUNNING
    done = running.pop(0)  # finished
    waiting.append(running.pop(0))  # retracted back to the queue
    aborted = waiting.pop(0)
    waiting.append(req("new", "C"))
    q.sync(waiting, running)
    q.check(waiting, running)
    assert done.rid not in q.index and aborted.rid not in q.index
    assert q.index.state("B0") is RequestState.WAITING
    q.sync([], [])
    assert q.index.is_empty()


def test_the_view_counts_retractions_as_preemptions():
    q = SGLangQueue(GroupedPolicy(), chunk_tokens=32)
    waiting = interleaved(2)
    running = [waiting.pop(0), waiting.pop(0)]
    q.sync(waiting, running)
    assert q.num_preemptions == 0
    waiting.append(running.pop())  # retracted: back in the list
    q.sync(waiting, running)
    assert q.num_preemptions == 1
    running.append(waiting.pop())  # admitted again, then finished: no preemption
    q.sync(waiting, running)
    q.sync(waiting, [])
    assert q.num_preemptions == 1


def test_the_grouping_judge_reads_sglangs_budget():
    """Every prefix runs and two slots are free: SGLang's own order fills them with two
    16-token suffixes in one pass, so grouped order cannot pay (on the measured H200, no
    locality to gain either) once the view says the budget; unknown, grouped order is kept."""
    from feather_sched.cost.step_model import StepCostModel
    from feather_sched.policies.order import GroupingJudge

    q = SGLangQueue(GroupedPolicy(), chunk_tokens=32)
    waiting = interleaved(3)
    running = [r for r in waiting if r.rid[1] in "01"]
    waiting = [r for r in waiting if r not in running]
    q.begin_pass(waiting, running)
    q.max_num_seqs = len(running) + 2
    judge = GroupingJudge(StepCostModel("h200", "llama-3.1-8b"))
    assert judge.grouping_pays(q)  # budget unknown
    q.max_num_batched_tokens = 8192
    assert judge.idle_share(q) < 1e-3
    assert not judge.grouping_pays(q)
    waiting.append(running.pop())  # a retraction: KV binds for a while
    q.begin_pass(waiting, running)
    assert judge.grouping_pays(q)


def test_handover_when_scheduler_skips_the_candidate():
    q = SGLangQueue(GroupedPolicy(), chunk_tokens=32)
    waiting = interleaved(2)
    q.begin_pass(waiting, [req("A-run", "A")])
    other = waiting[3]
    assert q.before_offer(other, nothing_admitted=True) is Offer.TRY  # SGLang's order now
    q.after_offer(other, added=True, proceed=True, chunked=False)
    assert q.stats.handovers == 1 and q.index.state(other.rid) is RequestState.RUNNING


def test_policy_errors_hand_the_pass_to_sglang():
    class Broken(GroupedPolicy):
        def follows_queue_order(self, view):
            return False  # make the pass ask it (nothing is shared in this list)

        def candidates(self, view):
            yield "nope"

    q = SGLangQueue(Broken(), chunk_tokens=32)
    waiting = interleaved(1)
    q.begin_pass(waiting, [])
    assert [r.rid for r in waiting] == ["A0", "B0", "C0", "D0"]  # untouched
    assert q.stats.policy_errors == 1
    assert len(scheduler_loop(q, waiting, fits=3)) == 3


def test_step_feedback_reaches_the_policy():
    seen = []

    class Recording(GroupedPolicy):
        def end_step(self, view, step_time, batch_size, prefill_tokens=0):
            seen.append((round(step_time, 3), batch_size, prefill_tokens))

    t = iter([1.0, 1.5, 1.6, 2.5, 3.0, 3.1])
    q = SGLangQueue(Recording(), clock=lambda: next(t))
    q.end_previous_step()  # first iteration: nothing ran before it
    q.on_step(4, 100)  # picked at 1.0
    q.end_previous_step()  # 1.5: the 4-request step took 0.5 s, reported before admitting
    q.on_step(0, 0)  # idle iteration (1.6)
    q.end_previous_step()  # the idle one reports nothing (and reads no clock)
    q.on_step(3, 0)  # 2.5
    q.end_previous_step()  # 2.5 -> 3.0
    q.on_step(3, 0)  # 3.1
    assert seen == [(0.5, 4, 100), (0.5, 3, 0)]


@pytest.mark.parametrize(
    ("env", "policy"),
    [
        ({}, None),  # installed is not enabled
        ({"SGLANG_PLUGINS": "feather"}, "feather"),  # the same default as vLLM's
        ({"SGLANG_PLUGINS": "other,feather"}, "feather"),
        ({"SGLANG_PLUGINS": "feather", "FEATHER_POLICY": "grouped"}, "grouped"),
        ({"FEATHER_POLICY": "feather"}, "feather"),
        ({"SGLANG_PLUGINS": "feather", "FEATHER_POLICY": "off"}, None),
    ],
)
def test_config_from_env(env, policy):
    assert settings_from_env(env).policy == policy


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="FEATHER_POLICY_OPTIONS"):
        settings_from_env({"FEATHER_POLICY_OPTIONS": "[1]"})
    with pytest.raises(ValueError, match="FEATHER_CHUNK_TOKENS"):
        settings_from_env({"FEATHER_CHUNK_TOKENS": "0"})


RADIX = SimpleNamespace(disable=False)  # SGLang's radix cache, on (only `disable` is read)


def radix_pass(
    q: SGLangQueue,
    waiting: list,
    running: list,
    cached: set,
    fits: int,
    kv_tokens: int | None = None,
) -> list:
    """One SGLang pass with its radix cache: each offered request's `prefix_len` is its group
    prefix if that prefix was computed by an earlier pass (SGLang matches it just before
    offering), else 0. The pass's prefills then run: their prefixes become cached."""
    for r in waiting:
        r.prefix_len = len(PREFIX[r.rid[0]]) if r.rid[0] in cached else 0
    q.begin_pass(waiting, running)
    batch = scheduler_loop(q, waiting, fits, kv_tokens)
    for r in batch:
        waiting.remove(r)
        running.append(r)
        cached.add(r.rid[0])
    return batch


def test_members_of_a_prefix_in_flight_wait_one_pass_for_the_cache():
    """Cold: the first pass takes A0, then its members would each compute A's prefix again,
    so they are skipped and the pass goes on in SGLang's list order, taking each other
    group's first request (the rest skipped alike); the next pass takes all the members, a
    cache hit each, grouped. Each prefix is computed once and no pass ends with room left."""
    q = SGLangQueue(GroupedPolicy(), chunk_tokens=32, tree_cache=RADIX)
    waiting, running, cached = interleaved(4), [], set()
    passes = []
    while waiting and len(passes) < 16:
        passes.append([r.rid for r in radix_pass(q, waiting, running, cached, fits=100)])
    assert passes == [["A0", "B0", "C0", "D0"], [f"{g}{i}" for g in "ABCD" for i in (1, 2, 3)]]
    assert q.stats.deferrals == 12 and q.stats.stops == 0  # not the policy's STOPs
    q.sync(waiting, running)
    q.check(waiting, running)


def test_after_a_deferral_the_policy_still_says_stop():
    """The requests taken in list order after a deferral are each the policy's ADD or STOP:
    a cap of 3 holds, and the adder's own limit ends the pass as before."""
    q = SGLangQueue(GroupedPolicy(max_batch=3), chunk_tokens=32, tree_cache=RADIX)
    waiting, running, cached = interleaved(4), [], set()
    batch = radix_pass(q, waiting, running, cached, fits=100)
    assert [r.rid for r in batch] == ["A0", "B0", "C0"]
    assert q.stats.stops == 1 and q.stats.deferrals == 1  # A1 skipped; D0 met the cap
    q2 = SGLangQueue(GroupedPolicy(), chunk_tokens=32, tree_cache=RADIX)
    waiting, running, cached = interleaved(4), [], set()
    assert [r.rid for r in radix_pass(q2, waiting, running, cached, fits=2)] == ["A0", "B0"]


def test_after_a_deferral_the_skipped_group_keeps_its_kv_room():
    """Each request: 144 prompt tokens (A's 128 shared) + 8 out = 152; A's three waiting
    members take 16 + 8 = 24 each once A0 has computed the prefix: 72 kept free. With room
    for B0 and 72 more, B0 joins A0; with less, the pass stops and A's members get it."""
    for kv_tokens, first in ((152 + 152 + 72, ["A0", "B0"]), (152 + 152 + 71, ["A0"])):
        q = SGLangQueue(GroupedPolicy(), chunk_tokens=32, tree_cache=RADIX)
        waiting, running, cached = interleaved(4), [], set()
        batch = radix_pass(q, waiting, running, cached, fits=100, kv_tokens=kv_tokens)
        assert [r.rid for r in batch] == first
        assert q.stats.stops == 0  # the room rule, not the policy's STOP
        room = kv_tokens - sum(map(kv_need, batch))
        members = radix_pass(q, waiting, running, cached, fits=100, kv_tokens=room)
        assert [r.rid for r in members][:3] == ["A1", "A2", "A3"]


def test_without_a_radix_cache_nothing_is_deferred():
    q = SGLangQueue(GroupedPolicy(), chunk_tokens=32, tree_cache=SimpleNamespace(disable=True))
    waiting, running, cached = interleaved(2), [], set()
    first = radix_pass(q, waiting, running, cached, fits=100)
    assert [r.rid for r in first] == ["A0", "A1", "B0", "B1", "C0", "C1", "D0", "D1"]
    assert q.stats.deferrals == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from("ABCD"), min_size=1, max_size=24),
    st.lists(st.integers(1, 6), min_size=1, max_size=8),
    st.booleans(),
    st.sampled_from(["grouped", "feather"]),
    st.one_of(st.none(), st.integers(100, 2000)),
)
@example(list("AAAAAAAAAAAAAABBCC"), [1], False, "feather", None)  # CI: STOPs took passes
def test_deferral_never_loses_duplicates_or_starves(groups, fits, finish, policy, kv_tokens):
    """Any arrivals, any adder capacity and KV room per pass, requests finishing or not: every
    request is admitted exactly once and the CHT follows SGLang's lists. A deferral never
    wastes a pass (its group's prefix is cached by the next), so under `grouped`, which
    never says STOP, every pass admits someone; `feather` may also spend passes on
    exploratory STOPs, a bounded number (its budget)."""
    from feather_sched.policies.registry import make_policy

    reqs = [req(f"{g}{i}", g) for i, g in enumerate(groups)]
    waiting, running, cached, admitted = list(reqs), [], set(), []
    q = SGLangQueue(make_policy(policy), chunk_tokens=32, tree_cache=RADIX)
    limit = len(reqs) if policy == "grouped" else 3 * len(reqs) + 10
    for n in range(limit):
        if not waiting:
            break
        admitted += radix_pass(q, waiting, running, cached, fits[n % len(fits)], kv_tokens)
        if finish:
            running.clear()  # they finished: the next pass runs nothing
        q.sync(waiting, running)
        q.check(waiting, running)
    assert sorted(r.rid for r in admitted) == sorted(r.rid for r in reqs)
    assert len({r.rid for r in admitted}) == len(admitted)


def test_identical_prompts_are_not_deferred_behind_each_other():
    """Parallel sampling: the same 128-token prompt twice, pages of 32 tokens. SGLang never
    matches a prompt's last token, so page-aligned the running twin's cached prompt covers 96
    tokens of the other's 128 shared: all it can, so the second is no in-flight duplicate."""
    q = SGLangQueue(GroupedPolicy(), chunk_tokens=32, block_size=32, tree_cache=RADIX)
    ids = array("q", PREFIX["A"])
    twins = [
        StandInReq(rid=r, origin_input_ids=ids, sampling_params=SimpleNamespace())
        for r in ("s0", "s1")
    ]
    q.begin_pass(twins[:1], [])
    assert scheduler_loop(q, twins[:1], fits=1) == twins[:1]
    twins[1].prefix_len = 96  # what SGLang's radix match gives it
    q.begin_pass(twins[1:], twins[:1])
    assert scheduler_loop(q, twins[1:], fits=1) == twins[1:]
    assert q.stats.deferrals == 0


class SGLangLists(RuleBasedStateMachine):
    """SGLang's waiting list and running batch under any mix of what its scheduler does to
    them between passes (arrivals, admissions, finishes, retractions, aborts anywhere, its own
    re-sort): after every sync the CHT holds exactly the lists, whether the sync read only
    the appended tail (`ListSnapshot`) or diffed the whole list, and whether the policy or
    SGLang's own order drove the pass."""

    def __init__(self) -> None:
        super().__init__()
        self.q = SGLangQueue(GroupedPolicy(), chunk_tokens=32)
        self.waiting: list = []
        self.running: list = []
        self.n = 0

    @rule(group=st.sampled_from("ABCD"))
    def arrive(self, group):
        self.n += 1
        self.waiting.append(req(f"{group}{self.n}", group))

    def head_totals_agree(self):
        """The wave's sums the adapter keeps (`head_totals`) are those read request by
        request, at every length, whenever the list and the CHT are in step."""
        q = self.q
        for n in (1, 3, len(self.waiting) + 1):
            rids = list(itertools.islice(q.waiting_ids(), n))
            read = sum(q.request(r).output_len for r in rids)
            levels = sum(map(q.index.total_chunks, rids))
            assert q.head_totals(n) == (len(rids), read, levels)

    @rule(fits=st.integers(0, 4))
    def admission_pass(self, fits):
        self.q.begin_pass(self.waiting, self.running)
        self.q.check(self.waiting, self.running)
        self.head_totals_agree()
        admitted = scheduler_loop(self.q, self.waiting, fits)
        done = set(map(id, admitted))
        self.waiting = [r for r in self.waiting if id(r) not in done]  # a new list, as SGLang
        self.running += admitted

    @rule(data=st.data())
    def finish(self, data):
        if self.running:
            self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))

    @rule(data=st.data())
    def retract(self, data):
        if self.running:
            i = data.draw(st.integers(0, len(self.running) - 1))
            self.waiting.append(self.running.pop(i))

    @rule(data=st.data())
    def abort_waiting(self, data):
        if self.waiting:
            del self.waiting[data.draw(st.integers(0, len(self.waiting) - 1))]  # in place

    @rule()
    def resort(self):
        self.waiting.reverse()

    @rule(data=st.data())
    def replace_running_object(self, data):
        """A running request's object swapped for a copy under the same rid: the running
        batch is diffed by object identity, so the CHT must still end in step."""
        if self.running:
            i = data.draw(st.integers(0, len(self.running) - 1))
            self.running[i] = copy.copy(self.running[i])

    @rule(name=st.sampled_from(["grouped", "fcfs"]))
    def swap_policy(self, name):
        """Between passes, as `scheduler.feather.policy = ...` may: `fcfs` leaves every pass
        in SGLang's order."""
        from feather_sched.policies.registry import make_policy

        self.q.policy = make_policy(name)

    @rule()
    def idle_sync(self):
        self.q.sync(self.waiting, self.running)
        self.q.check(self.waiting, self.running)
        self.head_totals_agree()


TestSGLangLists = SGLangLists.TestCase
TestSGLangLists.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("policy", ["grouped", "fcfs"])
def test_a_plain_pass_reads_only_the_appended_tail(policy):
    """Admit from the head, append arrivals: the next sync takes the snapshot's fast path,
    whether the policy drove the pass (`grouped`) or left it to SGLang's order (`fcfs`)."""
    from feather_sched.policies.registry import make_policy

    q = SGLangQueue(make_policy(policy), chunk_tokens=32)
    waiting, running = interleaved(4), []
    for step in range(3):
        q.begin_pass(waiting, running)
        admitted = scheduler_loop(q, waiting, fits=2)
        waiting = [r for r in waiting if r not in admitted] + [req(f"new{step}", "A")]
        running += admitted
    q.sync(waiting, running)
    q.check(waiting, running)
    assert (q.lists.snapshot.full, q.lists.snapshot.fast) == (1, 3)


def test_a_tail_holding_a_waiting_request_is_diffed_in_full_and_counted_so():
    """A tail that names a request already waiting (the list is not what the snapshot
    thinks) is rejected: the whole list is diffed, and the count says so."""
    q = SGLangQueue(GroupedPolicy(), chunk_tokens=32)
    waiting = interleaved(2)
    q.sync(waiting, [])
    q.sync([*waiting, waiting[0]], [])
    assert (q.lists.snapshot.full, q.lists.snapshot.fast) == (2, 0)
    q.check(waiting, [])


@given(st.integers(1, 40), st.data())
def test_move_is_pop_then_insert(n, data):
    from feather_sched.sglang.snapshot import move

    j = data.draw(st.integers(0, n - 1))
    slot = data.draw(st.integers(0, j))
    got, want = list(range(n)), list(range(n))
    move(got, j, slot)
    want.insert(slot, want.pop(j))
    assert got == want


def test_position_finds_requests_in_a_sorted_or_resorted_list():
    """The binary search on entry order finds every request; a list SGLang re-sorted still
    finds them (the scan behind the identity check)."""
    q = SGLangQueue(GroupedPolicy(), chunk_tokens=32)
    waiting = interleaved(10)
    q.sync(waiting, [])
    assert [q._position(waiting, r, 0) for r in waiting] == list(range(len(waiting)))
    waiting.reverse()
    assert [q._position(waiting, r, 0) for r in waiting] == list(range(len(waiting)))
    stranger = req("Z0", "A")  # never seen waiting: not in the order, found by the scan
    assert q._position([*waiting, stranger], stranger, 3) == len(waiting)
    with pytest.raises(ValueError):
        q._position(waiting[:5], waiting[7], 0)


@given(st.integers(1, 30), st.data())
def test_snapshot_reads_only_the_tail_after_admissions_anywhere_in_the_pass(n, data):
    """Feather moves candidates to the head, SGLang admits some entries in list order (past
    skipped ones too: the deferral), filters them out (a new list, or the same one when it
    admitted nothing) and appends arrivals: the snapshot names exactly the arrivals. An
    abort or a reorder it did not see makes it answer None (the caller diffs it all)."""
    from feather_sched.sglang.snapshot import ListSnapshot, move

    queue = [object() for _ in range(n)]
    snap = ListSnapshot()
    snap.take(queue)
    for slot in range(data.draw(st.integers(0, min(3, n)))):
        j = data.draw(st.integers(slot, n - 1))
        move(queue, j, slot)
        snap.moved(j, slot)
    picked = data.draw(st.sets(st.integers(0, n - 1), max_size=n))
    admitted = [queue[i] for i in sorted(picked)]
    for entry in admitted:
        snap.admitted(entry)
    tail = [object() for _ in range(data.draw(st.integers(0, 3)))]
    if admitted or data.draw(st.booleans()):
        gone = set(map(id, admitted))
        after = [x for x in queue if id(x) not in gone] + tail  # SGLang's new list
    else:
        after = queue  # kept: appended in place
        after.extend(tail)
    unseen = data.draw(st.sampled_from(["none", "abort", "swap"]))
    kept = len(after) - len(tail)
    if unseen == "abort" and kept:
        del after[data.draw(st.integers(0, kept - 1))]
    elif unseen == "swap" and kept >= 2:
        after[0], after[kept - 1] = after[kept - 1], after[0]
    else:
        unseen = "none"
    got = snap.appended(after)
    assert got == tail if unseen == "none" else got is None
    snap.take(after)  # the next pass starts from a copy equal to the list
    assert snap.appended(after) == []
