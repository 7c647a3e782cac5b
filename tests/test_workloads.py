"""Workload generators, arrival processes, the registry and sharing statistics."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import struct
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.table import Table

from feather_lab.workloads import (
    WORKLOADS,
    AllAtOnce,
    ArrivalProcess,
    Bursts,
    DocumentQAWorkload,
    LongPrefixWorkload,
    MultiTurnWorkload,
    NoSharingWorkload,
    Poisson,
    SharedPrefixWorkload,
    TreeWorkload,
    Workload,
    make_workload,
    parse_arrival,
    render_stats,
    trace_stats,
)
from feather_lab.workloads.prefix_groups import PrefixGroups
from feather_lab.workloads.stats import (
    cacheable_prefix_lengths,
    common_prefix_len,
    shared_prefix_lengths,
)
from feather_sched.request import Request


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    """Reference longest common prefix, token by token."""
    n = 0
    for x, y in zip(a.tolist(), b.tolist(), strict=False):
        if x != y:
            break
        n += 1
    return n


# Small configs so every test stays fast; each must exercise the workload's structure.
SMALL: dict[str, Workload] = {
    "shared-prefix": SharedPrefixWorkload(
        num_groups=4, prompts_per_group=5, system_prompt_len=40, question_len=8, output_len=7
    ),
    "long-prefix": LongPrefixWorkload(
        num_prefixes=3, prefix_len=50, prefix_len_max=80, requests_per_prefix=6, suffix_len=5
    ),
    "document-qa": DocumentQAWorkload(
        num_documents=3, document_len=60, questions_per_document=4, question_len=6
    ),
    "tree": TreeWorkload(
        num_trees=2, root_len=30, branching=3, depth=2, branch_len=10, samples_per_leaf=2
    ),
    "multi-turn": MultiTurnWorkload(
        num_conversations=4, turns=3, first_turn_len=20, turn_len=5, output_len=6
    ),
    "no-sharing": NoSharingWorkload(num_requests=30, prompt_len=25, output_len=9),
}


def as_tuples(requests: list[Request]) -> list[tuple]:
    return [
        (r.request_id, r.prompt.tolist(), r.output_len, r.arrival_time, r.group, r.meta)
        for r in requests
    ]


# ----------------------------------------------------------------------------- arrivals


def test_all_at_once() -> None:
    times = AllAtOnce().times(5, np.random.default_rng(0))
    assert times.dtype == np.float64
    assert times.tolist() == [0.0] * 5


def test_poisson_mean_gap_matches_rate() -> None:
    rate = 4.0
    times = Poisson(rate).times(10_000, np.random.default_rng(7))
    gaps = np.diff(times)
    assert times[0] == 0.0
    assert np.all(gaps >= 0)
    # std of the mean of 9,999 exponential gaps is (1/rate)/sqrt(9999) ~ 1%; allow 5%.
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    assert gaps.std() == pytest.approx(1 / rate, rel=0.05)


def test_poisson_is_seeded() -> None:
    a = Poisson(2.0).times(50, np.random.default_rng(1))
    b = Poisson(2.0).times(50, np.random.default_rng(1))
    c = Poisson(2.0).times(50, np.random.default_rng(2))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_bursts_exact() -> None:
    times = Bursts(burst_size=3, interval_s=2.5).times(8, np.random.default_rng(0))
    assert times.tolist() == [0.0, 0.0, 0.0, 2.5, 2.5, 2.5, 5.0, 5.0]


@pytest.mark.parametrize("process", [AllAtOnce(), Poisson(3.0), Bursts(2, 1.0)])
def test_zero_arrivals_and_protocol(process: ArrivalProcess) -> None:
    assert isinstance(process, ArrivalProcess)
    assert process.times(0, np.random.default_rng(0)).shape == (0,)
    with pytest.raises(ValueError, match="number of arrivals"):
        process.times(-1, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Poisson(0), "rate must be finite and > 0"),
        (lambda: Poisson(-1.0), "rate must be finite and > 0"),
        (lambda: Poisson(float("inf")), "rate must be finite and > 0"),
        (lambda: Poisson("fast"), "rate must be a number"),
        (lambda: Bursts(0, 1.0), "burst_size must be an integer >= 1"),
        (lambda: Bursts(2.5, 1.0), "burst_size must be an integer >= 1"),
        (lambda: Bursts(2, -1.0), "interval_s must be finite and >= 0"),
    ],
)
def test_arrival_validation(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("all", AllAtOnce()),
        (" ALL ", AllAtOnce()),
        ("poisson:2.5", Poisson(2.5)),
        ("poisson:10", Poisson(10.0)),
        ("bursts:8:0.5", Bursts(8, 0.5)),
    ],
)
def test_parse_arrival(spec: str, expected: ArrivalProcess) -> None:
    process = parse_arrival(spec)
    assert process == expected
    assert parse_arrival(process.spec) == process


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("uniform", "unknown kind 'uniform'"),
        ("all:3", "takes no parameters"),
        ("poisson", "exactly one parameter"),
        ("poisson:fast", "rate 'fast' is not a number"),
        ("poisson:0", "rate must be finite and > 0"),
        ("poisson:nan", "rate must be finite and > 0"),
        ("bursts:4", "two parameters"),
        ("bursts:4.5:1", "size '4.5' is not an integer"),
        ("bursts:4:-1", "interval_s must be finite and >= 0"),
        ("", "unknown kind ''"),
    ],
)
def test_parse_arrival_errors(spec: str, why: str) -> None:
    with pytest.raises(ValueError, match="bad arrival spec") as info:
        parse_arrival(spec)
    assert why in str(info.value)
    assert "poisson:RATE" in str(info.value)  # the message says what is accepted


# ----------------------------------------------------------------------------- all generators


@pytest.mark.parametrize("name", sorted(SMALL))
def test_generators_are_deterministic(name: str) -> None:
    workload = SMALL[name]
    a, b, c = workload.generate(3), workload.generate(3), workload.generate(4)
    assert as_tuples(a) == as_tuples(b)
    assert [r.prompt.tolist() for r in a] != [r.prompt.tolist() for r in c]


# sha256 of every field of every request of SMALL[name].generate(0), recorded before the
# prefix-group generators were merged into one (`prefix_groups.py`): refactors must keep each
# workload's token stream, ids, order and labels exactly. numpy promises Generator streams
# only per version, so a numpy upgrade may need these re-recorded (check the diff first).
GOLDEN = {
    "document-qa": "5bf689ff31403cf4",
    "long-prefix": "967782ea3cf58e74",
    "multi-turn": "35ad24b377848f1b",
    "no-sharing": "74c31b6a413a8c24",
    "shared-prefix": "4c1aea7181ea4b9b",
    "tree": "3014321d02282715",
}


def digest(requests: list[Request]) -> str:
    h = hashlib.sha256()
    for r in requests:
        h.update(r.request_id.encode() + b"\0")
        h.update(r.prompt.astype("<i4").tobytes())
        h.update(struct.pack("<qd", r.output_len, r.arrival_time))
        h.update(json.dumps([r.group, r.meta], sort_keys=True).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(SMALL))
def test_generators_match_recorded_output(name: str) -> None:
    assert digest(SMALL[name].generate(0)) == GOLDEN[name]


def test_shared_prefix_is_a_one_level_tree() -> None:
    """One generator serves the family: a flat group draws exactly what a depth-1 tree does."""
    flat = SharedPrefixWorkload(num_groups=3, prompts_per_group=4, system_prompt_len=9,
                                question_len=5, shuffle=False)  # fmt: skip
    tree = TreeWorkload(num_trees=3, root_len=9, branching=4, depth=1, branch_len=5,
                        samples_per_leaf=1, shuffle=False)  # fmt: skip
    a, b = flat.generate(2), tree.generate(2)
    assert [r.prompt.tolist() for r in a] == [r.prompt.tolist() for r in b]
    assert [r.meta["path"] for r in b] == [[i] for _ in range(3) for i in range(4)]
    assert flat.shape() == PrefixGroups(
        "sp", "prefix", 3, 9, flat.output_len, flat.vocab_size, levels=((4, 5),)
    )


def test_validation_reports_the_first_bad_field_declared() -> None:
    with pytest.raises(ValueError, match=r"LongPrefixWorkload\.prefix_len_max must be >= 10"):
        LongPrefixWorkload(prefix_len=10, prefix_len_max=5, requests_per_prefix=-1)
    with pytest.raises(ValueError, match=r"MultiTurnWorkload\.turns must be >= 1"):
        MultiTurnWorkload(turns=0, think_time_s=-1.0)
    with pytest.raises(ValueError, match="must be an integer, got None"):
        SharedPrefixWorkload(num_groups=None)
    assert LongPrefixWorkload(prefix_len_max=None).prefix_len_max is None


@pytest.mark.parametrize("name", sorted(SMALL))
def test_generators_common_contract(name: str) -> None:
    workload = SMALL[name]
    assert isinstance(workload, Workload)
    requests = workload.generate(0)
    ids = [r.request_id for r in requests]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)  # numbered in arrival order
    arrivals = [r.arrival_time for r in requests]
    assert arrivals == sorted(arrivals)
    for r in requests:
        assert r.prompt.dtype == np.int32
        assert r.prompt.min() >= 0
        assert r.prompt.max() < workload.vocab_size
    # no two requests alias one prompt buffer
    assert len({id(r.prompt) for r in requests}) == len(requests)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_arrival_process_changes_times_not_prompts(name: str) -> None:
    base = SMALL[name]
    poisson = dataclasses.replace(base, arrival=Poisson(5.0))
    a, b = base.generate(1), poisson.generate(1)
    assert sorted(r.prompt.tobytes() for r in a) == sorted(r.prompt.tobytes() for r in b)
    assert max(r.arrival_time for r in b) > 0


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_vocab(name: str) -> None:
    workload = dataclasses.replace(SMALL[name], vocab_size=3)
    for r in workload.generate(0):
        assert set(np.unique(r.prompt).tolist()) <= {0, 1, 2}


# ----------------------------------------------------------------------------- shared prefix


def by_group(requests: list[Request]) -> dict[str, list[Request]]:
    groups: dict[str, list[Request]] = defaultdict(list)
    for r in requests:
        groups[r.group].append(r)
    return groups


def test_shared_prefix_structure() -> None:
    w = SMALL["shared-prefix"]
    requests = w.generate(0)
    assert len(requests) == w.num_groups * w.prompts_per_group
    assert all(r.prompt_len == w.system_prompt_len + w.question_len for r in requests)
    assert all(r.output_len == w.output_len for r in requests)
    groups = by_group(requests)
    assert sorted(groups) == [f"prefix-{g}" for g in range(w.num_groups)]
    assert all(len(members) == w.prompts_per_group for members in groups.values())
    for members in groups.values():
        for a, b in itertools.combinations(members, 2):
            assert lcp(a.prompt, b.prompt) == w.system_prompt_len
    for ga, gb in itertools.combinations(groups.values(), 2):
        assert lcp(ga[0].prompt, gb[0].prompt) < w.system_prompt_len
    assert all(r.meta["prefix_len"] == w.system_prompt_len for r in requests)


def test_shared_prefix_shuffle() -> None:
    w = SMALL["shared-prefix"]
    shuffled = [r.group for r in w.generate(0)]
    grouped = [r.group for r in dataclasses.replace(w, shuffle=False).generate(0)]
    assert grouped == sorted(grouped, key=lambda g: int(g.split("-")[1]))
    assert shuffled != grouped
    assert sorted(shuffled) == sorted(grouped)


def test_shared_prefix_defaults_match_sglang_benchmark() -> None:
    w = SharedPrefixWorkload()
    assert (w.num_groups, w.prompts_per_group, w.system_prompt_len) == (64, 16, 2048)
    assert (w.question_len, w.output_len, w.vocab_size) == (128, 256, 32000)
    assert w.arrival == AllAtOnce()


# ----------------------------------------------------------------------------- long prefix


def test_long_prefix_lengths_in_range() -> None:
    w = SMALL["long-prefix"]
    requests = w.generate(0)
    assert len(requests) == w.num_prefixes * w.requests_per_prefix
    groups = by_group(requests)
    assert len(groups) == w.num_prefixes
    lengths = set()
    for members in groups.values():
        plen = members[0].meta["prefix_len"]
        lengths.add(plen)
        assert w.prefix_len <= plen <= w.prefix_len_max
        for r in members:
            assert r.prompt_len == plen + w.suffix_len
            assert np.array_equal(r.prompt[:plen], members[0].prompt[:plen])
    assert len(lengths) > 1  # the lengths were drawn, not fixed


def test_long_prefix_fixed_length_default() -> None:
    w = LongPrefixWorkload(prefix_len=100, requests_per_prefix=3)
    assert w.num_prefixes == 5  # the bench suite's long-prefix: one name, one workload
    assert {r.prompt_len for r in w.generate(0)} == {100 + w.suffix_len}
    with pytest.raises(ValueError, match="prefix_len_max must be >= 100"):
        LongPrefixWorkload(prefix_len=100, prefix_len_max=50)


# ----------------------------------------------------------------------------- document QA


def test_document_qa_structure() -> None:
    w = SMALL["document-qa"]
    requests = w.generate(0)
    assert len(requests) == w.num_documents * w.questions_per_document
    for members in by_group(requests).values():
        assert len(members) == w.questions_per_document
        for a, b in itertools.combinations(members, 2):
            assert lcp(a.prompt, b.prompt) >= w.document_len
            assert a.prompt_len == w.document_len + w.question_len


# ----------------------------------------------------------------------------- tree


def test_tree_structure() -> None:
    w = SMALL["tree"]
    requests = w.generate(0)
    leaves = w.branching**w.depth
    assert len(requests) == w.num_trees * leaves * w.samples_per_leaf
    assert all(r.prompt_len == w.root_len + w.depth * w.branch_len for r in requests)
    for members in by_group(requests).values():
        assert len(members) == leaves * w.samples_per_leaf
        assert len({tuple(r.meta["path"]) for r in members}) == leaves
        for a, b in itertools.combinations(members, 2):
            pa, pb = a.meta["path"], b.meta["path"]
            common_levels = lcp(np.array(pa), np.array(pb))
            shared = lcp(a.prompt, b.prompt)
            if pa == pb:  # parallel samples of one leaf: identical prompts
                assert shared == a.prompt_len
                assert a.meta["sample"] != b.meta["sample"]
            else:  # share the root and the path down to their lowest common ancestor
                assert shared >= w.root_len + common_levels * w.branch_len
                assert shared < w.root_len + (common_levels + 1) * w.branch_len
    trees = list(by_group(requests).values())
    assert lcp(trees[0][0].prompt, trees[1][0].prompt) < w.root_len


def test_tree_depth_zero_is_parallel_sampling_of_roots() -> None:
    w = TreeWorkload(num_trees=3, root_len=12, depth=0, samples_per_leaf=5)
    requests = w.generate(0)
    assert len(requests) == 15
    assert len({r.prompt.tobytes() for r in requests}) == 3


# ----------------------------------------------------------------------------- multi-turn


def test_multi_turn_structure() -> None:
    w = SMALL["multi-turn"]
    requests = w.generate(0)
    assert len(requests) == w.num_conversations * w.turns
    by_id = {r.request_id: r for r in requests}
    for members in by_group(requests).values():
        members.sort(key=lambda r: r.meta["turn"])
        assert [r.meta["turn"] for r in members] == list(range(w.turns))
        assert members[0].meta["depends_on"] is None
        for k, r in enumerate(members):
            assert r.prompt_len == w.first_turn_len + k * (w.output_len + w.turn_len)
            if k == 0:
                continue
            prev = by_id[r.meta["depends_on"]]
            assert prev is members[k - 1]
            assert np.array_equal(r.prompt[: prev.prompt_len], prev.prompt)
            assert r.arrival_time == pytest.approx(prev.arrival_time + w.think_time_s)
            assert prev.request_id < r.request_id


def test_multi_turn_starts_follow_arrival_process() -> None:
    w = MultiTurnWorkload(
        num_conversations=4, turns=2, first_turn_len=4, turn_len=2, output_len=2,
        think_time_s=0.25, arrival=Bursts(2, 10.0),
    )  # fmt: skip
    firsts = sorted(r.arrival_time for r in w.generate(0) if r.meta["turn"] == 0)
    seconds = sorted(r.arrival_time for r in w.generate(0) if r.meta["turn"] == 1)
    assert firsts == [0.0, 0.0, 10.0, 10.0]
    assert seconds == [0.25, 0.25, 10.25, 10.25]


# ----------------------------------------------------------------------------- no sharing


def test_no_sharing_shapes() -> None:
    w = SMALL["no-sharing"]
    requests = w.generate(0)
    assert len(requests) == w.num_requests
    assert all(r.prompt_len == w.prompt_len and r.group is None for r in requests)
    assert NoSharingWorkload().prompt_len == (
        SharedPrefixWorkload().system_prompt_len + SharedPrefixWorkload().question_len
    )
    assert max(shared_prefix_lengths([r.prompt for r in requests])) <= 2


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SharedPrefixWorkload(num_groups=-1), r"SharedPrefixWorkload\.num_groups"),
        (lambda: SharedPrefixWorkload(output_len=0), r"output_len must be >= 1"),
        (lambda: SharedPrefixWorkload(vocab_size=0), r"vocab_size must be >= 1"),
        (lambda: SharedPrefixWorkload(system_prompt_len=0, question_len=0), "must be >= 1"),
        (lambda: SharedPrefixWorkload(question_len=2.5), "must be an integer"),
        (lambda: SharedPrefixWorkload(arrival="poisson:0"), "bad arrival spec"),
        (lambda: SharedPrefixWorkload(arrival=3), "must be an arrival process"),
        (lambda: TreeWorkload(branching=0), r"TreeWorkload\.branching must be >= 1"),
        (lambda: TreeWorkload(branching=100, depth=4), "leaves per tree"),
        (lambda: MultiTurnWorkload(think_time_s=-1.0), "think_time_s must be finite"),
        (lambda: MultiTurnWorkload(turns=0), r"turns must be >= 1"),
        (lambda: NoSharingWorkload(prompt_len=0), r"prompt_len must be >= 1"),
        (lambda: DocumentQAWorkload(num_documents=True), "must be an integer"),
    ],
)
def test_config_validation(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_seed() -> None:
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        SMALL["tree"].generate(-1)


def test_arrival_spec_string_is_accepted() -> None:
    w = SharedPrefixWorkload(num_groups=1, prompts_per_group=4, arrival="bursts:2:1.5")
    assert w.arrival == Bursts(2, 1.5)
    assert [r.arrival_time for r in w.generate(0)] == [0.0, 0.0, 1.5, 1.5]


# ----------------------------------------------------------------------------- registry


def test_registry_names() -> None:
    assert set(WORKLOADS) == {
        "shared-prefix", "long-prefix", "document-qa", "tree", "multi-turn", "no-sharing",
    }  # fmt: skip
    for name, factory in WORKLOADS.items():
        assert isinstance(make_workload(name), factory)


def test_make_workload_overrides() -> None:
    w = make_workload("shared-prefix", num_groups=2, prompts_per_group=3, arrival="poisson:4")
    assert isinstance(w, SharedPrefixWorkload)
    assert (w.num_groups, w.prompts_per_group, w.arrival) == (2, 3, Poisson(4.0))
    assert len(w.generate(0)) == 6


def test_make_workload_errors() -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'") as info:
        make_workload("nope")
    for name in WORKLOADS:
        assert name in str(info.value)
    assert "trace:PATH" in str(info.value)
    with pytest.raises(ValueError, match=r"no field.*groups.*valid fields:.*num_groups"):
        make_workload("shared-prefix", groups=3)
    with pytest.raises(ValueError, match="expected 'trace:PATH'"):
        make_workload("trace:")


# ----------------------------------------------------------------------------- stats


def req(i: int, tokens: list[int], arrival: float = 0.0, output_len: int = 1) -> Request:
    return Request(f"r{i}", np.array(tokens, dtype=np.int32), output_len, arrival)


def test_stats_hand_built() -> None:
    requests = [
        req(0, [1, 2, 3, 4, 5], arrival=2.0, output_len=3),  # shares 3 with r1 (earlier)
        req(1, [1, 2, 3, 9], arrival=1.0, output_len=2),  # shares 3 with r0; first to arrive
        req(2, [1, 2, 7], arrival=3.0),  # shares 2 with r0 and r1, both earlier
        req(3, [8, 8], arrival=4.0),  # shares nothing
        req(4, [1, 2, 3, 4, 5, 6], arrival=5.0),  # extends r0: shares 5, r0 earlier
    ]
    stats = trace_stats(requests)
    assert stats.num_requests == 5
    assert stats.prompt_tokens_total == 20
    assert stats.prompt_tokens_mean == 4.0
    assert stats.prompt_tokens_max == 6
    assert stats.output_tokens_total == 8
    assert stats.arrival_span_s == 4.0
    # any other: r0 5 (with r4), r1 3, r2 2, r3 0, r4 5
    assert stats.shared_prefix_tokens == 15
    assert stats.shared_prefix_share == 15 / 20
    # earlier: r1 0, r0 3, r2 2, r3 0, r4 5
    assert stats.cacheable_prefix_tokens == 10
    assert stats.cacheable_prefix_share == 10 / 20


def test_stats_ties_and_duplicates() -> None:
    # identical prompts arriving together: the first in list order is the "earlier" one
    requests = [req(0, [5, 5, 5]), req(1, [5, 5, 5]), req(2, [5, 5])]
    stats = trace_stats(requests)
    assert stats.shared_prefix_tokens == 3 + 3 + 2
    assert stats.cacheable_prefix_tokens == 0 + 3 + 2


def test_stats_empty_and_single() -> None:
    assert trace_stats([]).num_requests == 0
    one = trace_stats([req(0, [1, 2, 3])])
    assert one.shared_prefix_share == 0.0 and one.cacheable_prefix_share == 0.0


def test_stats_on_generators() -> None:
    w = SMALL["shared-prefix"]
    stats = trace_stats(w.generate(0))
    total = w.num_groups * w.prompts_per_group * (w.system_prompt_len + w.question_len)
    assert stats.prompt_tokens_total == total
    assert stats.shared_prefix_tokens >= w.num_groups * w.prompts_per_group * w.system_prompt_len
    assert (
        stats.cacheable_prefix_tokens
        >= w.num_groups * (w.prompts_per_group - 1) * w.system_prompt_len
    )
    assert trace_stats(SMALL["no-sharing"].generate(0)).shared_prefix_share < 0.01


def test_render_stats() -> None:
    table = render_stats(trace_stats([req(0, [1, 2]), req(1, [1, 3])]))
    assert isinstance(table, Table)
    assert table.row_count == 8


prompts_strategy = st.lists(
    st.lists(st.integers(0, 2), min_size=1, max_size=12), min_size=0, max_size=14
)


@settings(max_examples=150, deadline=None)
@given(prompts_strategy, st.randoms(use_true_random=False))
def test_prefix_lengths_match_brute_force(raw: list[list[int]], rnd) -> None:
    prompts = [np.array(p, dtype=np.int32) for p in raw]
    n = len(prompts)
    order = list(range(n))
    rnd.shuffle(order)
    any_other = [max((lcp(prompts[i], prompts[j]) for j in range(n) if j != i), default=0)
                 for i in range(n)]  # fmt: skip
    position = {i: k for k, i in enumerate(order)}
    earlier = [
        max((lcp(prompts[i], prompts[j]) for j in range(n) if position[j] < position[i]), default=0)
        for i in range(n)
    ]
    assert shared_prefix_lengths(prompts).tolist() == any_other
    assert cacheable_prefix_lengths(prompts, order).tolist() == earlier


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=300),
    st.lists(st.integers(0, 3), max_size=300),
)
def test_common_prefix_len(a: list[int], b: list[int]) -> None:
    x, y = np.array(a, dtype=np.int32), np.array(b, dtype=np.int32)
    assert common_prefix_len(x, y) == lcp(x, y)
    assert common_prefix_len(x, x) == len(a)


def test_common_prefix_len_long() -> None:
    a = np.arange(100_000, dtype=np.int32)
    b = a.copy()
    b[77_777] = -1
    assert common_prefix_len(a, b) == 77_777
