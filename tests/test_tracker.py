"""RequestTracker: the engine adapters' CHT bookkeeping, on fake engine requests (no engine)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather_lab.harness.tiny_llama import ENGINE_MODELS
from feather_sched.cost import load_model
from feather_sched.host.tracker import RequestTracker, TrackerError, hash_to_int, sample_chain
from feather_sched.index.cht import RequestState, chunk_digests

BLOCK = 4


def chained(tokens: list[int], block: int) -> list[bytes]:
    """vLLM-style block hashes: sha256 over (parent, block tokens), full blocks only."""
    out, parent = [], b""
    for i in range(len(tokens) // block):
        parent = hashlib.sha256(parent + str(tokens[i * block : (i + 1) * block]).encode()).digest()
        out.append(parent)
    return out


@dataclass
class FakeRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int = 4
    arrival_time: float = 1.0
    block_hashes: list[bytes] = field(default_factory=list)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def req(rid: str, tokens: list[int], hashed: bool = True) -> FakeRequest:
    return FakeRequest(rid, tokens, block_hashes=chained(tokens, BLOCK) if hashed else [])


PREFIX = list(range(100, 112))  # 3 blocks


def test_hash_to_int_and_sample_chain() -> None:
    assert hash_to_int(b"\x01" + b"\x00" * 31) == 1
    assert hash_to_int(7) == 7
    assert sample_chain([1, 2, 3, 4, 5], 1) == [1, 2, 3, 4, 5]
    assert sample_chain([1, 2, 3, 4, 5], 2) == [2, 4, 5]
    assert sample_chain([1, 2, 3, 4], 2) == [2, 4]
    assert sample_chain([], 3) == []


def test_engine_hashes_give_prefix_groups() -> None:
    index = RequestTracker(BLOCK)
    a, b = req("a", [*PREFIX, 1, 2, 3, 4, 5]), req("b", [*PREFIX, 9, 9, 9, 9])
    c = req("c", list(range(200, 216)))
    for r in (a, b, c):
        index.waiting(r, now=2.0)
    assert index.cht.num_waiting == 3
    index.running(a, now=3.0)
    best = index.cht.best_candidate()
    assert best is not None and best.request_id == "b" and best.matched_chunks == 3
    assert index.block_digests("a") == [hash_to_int(h) for h in a.block_hashes]
    assert index.request("a").prompt_len == 17 and index.request("a").output_len == 4
    assert index.entered("a") == 1.0  # its arrival time


def test_transitions_are_idempotent_and_forget_cleans_up() -> None:
    index = RequestTracker(BLOCK)
    a = req("a", [*PREFIX, 1])
    index.waiting(a, 1.0)
    index.waiting(a, 1.0)
    index.running(a, 2.0)
    index.running(a, 2.0)
    assert index.cht.state("a") is RequestState.RUNNING
    index.waiting(a, 5.0)  # preempted: waits again from now
    assert index.cht.state("a") is RequestState.WAITING and index.entered("a") == 5.0
    index.park("a")
    index.park("a")
    assert "a" not in index and index.num_tracked == 1  # metadata kept while parked
    index.running(a, 6.0)  # admitted from another queue
    index.forget("a")
    index.forget("a")
    assert len(index) == 0 and index.num_tracked == 0 and index.cht.is_empty()


def test_strict_tracker_refuses_moves_that_are_not_moves() -> None:
    """The simulator's setting: a bookkeeping bug raises instead of being absorbed."""
    index = RequestTracker(BLOCK, strict=True)
    a = req("a", [*PREFIX, 1])
    with pytest.raises(TrackerError, match="never waited"):
        index.running(a, 0.0)
    index.waiting(a, 0.0)
    with pytest.raises(TrackerError, match="already waiting"):
        index.waiting(a, 0.0)
    index.running(a, 1.0)
    with pytest.raises(TrackerError, match="already running"):
        index.running(a, 1.0)
    index.forget("a")
    with pytest.raises(TrackerError, match="not tracked"):
        index.forget("a")
    assert index.cht.is_empty() and not index.waiting_ids and not index.running_ids


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("wrpf"), st.integers(0, 5)), max_size=60))
def test_membership_sets_follow_the_cht(moves: list[tuple[str, int]]) -> None:
    """Whatever order a host's hooks fire in, the sets are the CHT's membership."""
    index = RequestTracker(BLOCK)
    reqs = [req(f"r{i}", [*PREFIX[: 4 * (i % 3)], i, i + 1]) for i in range(6)]
    for op, i in moves:
        r = reqs[i]
        if op == "w":
            index.waiting(r, 0.0)
        elif op == "r":
            index.running(r, 0.0)
        elif op == "p":
            index.park(r.request_id)
        else:
            index.forget(r.request_id)
        assert index.waiting_ids == set(index.cht.waiting_ids())
        assert index.running_ids == set(index.cht.running_ids())
    for r in reqs:
        index.forget(r.request_id)
    assert index.cht.is_empty() and index.num_tracked == 0


def test_without_engine_hashes_the_prompt_is_hashed_here() -> None:
    index = RequestTracker(BLOCK, chunk_blocks=2)
    tokens = [*PREFIX, 1, 2]
    index.waiting(req("a", tokens, hashed=False), 0.0)
    digests = [d for _, d in index.cht.keys_of("a")]
    assert digests == chunk_digests(np.array(tokens), 2 * BLOCK)
    assert index.block_digests("a") == chunk_digests(np.array(tokens[:12]), BLOCK)


def test_chunk_blocks_coarsens_the_chain() -> None:
    index = RequestTracker(BLOCK, chunk_blocks=2)
    a, b = req("a", [*PREFIX, 1, 2, 3, 4]), req("b", [*PREFIX, 5, 6, 7, 8])  # 4 blocks each
    index.waiting(a, 0.0)
    index.waiting(b, 0.0)
    assert len(index.cht.keys_of("a")) == 2
    index.running(a, 0.0)
    best = index.cht.best_candidate()
    assert best is not None and best.matched_chunks == 1  # chunk 0 = blocks 0-1 shared


def test_resync_rebuilds_from_engine_queues() -> None:
    index = RequestTracker(BLOCK)
    a, b, c = (req(x, [*PREFIX, i]) for i, x in enumerate("abc"))
    index.waiting(a, 0.0)
    index.running(b, 0.0)
    index.resync(running=[a], waiting=[c], now=1.0)
    assert index.cht.state("a") is RequestState.RUNNING
    assert index.cht.state("c") is RequestState.WAITING
    assert "b" not in index


def test_bad_sizes_rejected() -> None:
    with pytest.raises(ValueError):
        RequestTracker(0)
    with pytest.raises(ValueError):
        RequestTracker(16, chunk_blocks=0)


@pytest.mark.parametrize("name", list(ENGINE_MODELS))
def test_engine_model_is_built_with_its_profiles_head_dim(name: str) -> None:
    """The built Llama derives head_dim = hidden / heads; the cost model reads the profile's."""
    assert ENGINE_MODELS[name].head_dim == load_model(name).head_dim


@settings(max_examples=80, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**31 - 1), max_size=200),
    max_tokens=st.one_of(st.none(), st.integers(0, 5000)),
    arrival=st.one_of(st.none(), st.floats(0, 2e9)),
    engine=st.sampled_from(["vllm", "sglang"]),
)
def test_request_view_is_the_eager_request(tokens, max_tokens, arrival, engine) -> None:
    """The tracker's `RequestView` (every engine host's `SchedulerView.request`) equals the
    `Request` built eagerly from the same fields, for vLLM's and SGLang's request shapes;
    the prompt is copied only when read."""
    from array import array

    from feather_lab.harness.sglang_loop import StandInReq
    from feather_sched.host.tracker import RequestView
    from feather_sched.request import Request
    from feather_sched.sglang.fields import SGLANG_FIELDS

    if engine == "vllm":
        r = FakeRequest("r", tokens, max_tokens, arrival)  # type: ignore[arg-type]
        tracker = RequestTracker(BLOCK)
    else:
        params = StandInReq(max_new_tokens=max_tokens)
        r = StandInReq(rid="r", origin_input_ids=array("q", tokens), sampling_params=params)
        tracker = RequestTracker(1, 64, SGLANG_FIELDS)
    tracker.waiting(r, now=5.0)
    seen = 5.0 if arrival is None or engine == "sglang" else arrival  # SGLang: first seen
    eager = Request("r", np.asarray(tokens, dtype=np.int64), max(1, max_tokens or 1), seen)
    eager.meta = {"firm_output": False}
    view = tracker.request("r")
    assert isinstance(view, RequestView) and view is tracker.request("r")
    for name in ("request_id", "prompt_len", "output_len", "arrival_time", "group", "meta"):
        assert getattr(view, name) == getattr(eager, name), name
    assert view._prompt is None  # the lengths copied nothing
    assert view.prompt.dtype == np.int32 and np.array_equal(view.prompt, eager.prompt)
    assert view.prompt is view.prompt  # copied once
