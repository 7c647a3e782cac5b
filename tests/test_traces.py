"""Trace readers and writers: Mooncake (on the real file) and feather JSONL."""

from __future__ import annotations

import itertools
import json
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather_lab.workloads import (
    SharedPrefixWorkload,
    TraceFormatError,
    TraceWorkload,
    make_workload,
    read_jsonl,
    read_mooncake,
    read_trace,
    trace_stats,
    write_jsonl,
)
from feather_lab.workloads.traces import detect_format
from feather_sched.request import Request

# The first 400 requests of the public Mooncake trace, kept in the repository (tests/data).
MOONCAKE = Path(__file__).resolve().parent / "data" / "mooncake_sample.jsonl"
SAMPLE_REQUESTS = 400


def same(a: list[Request], b: list[Request]) -> bool:
    return len(a) == len(b) and all(
        x.request_id == y.request_id
        and np.array_equal(x.prompt, y.prompt)
        and x.prompt.dtype == y.prompt.dtype
        and x.output_len == y.output_len
        and x.arrival_time == y.arrival_time
        and x.group == y.group
        and x.meta == y.meta
        and x.max_tokens == y.max_tokens
        and x.ignore_eos == y.ignore_eos
        for x, y in zip(a, b, strict=True)
    )


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def mc_line(timestamp=0, input_length=1000, output_length=5, hash_ids=(1, 2), **extra) -> str:
    obj = {
        "timestamp": timestamp,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": list(hash_ids) if isinstance(hash_ids, tuple) else hash_ids,
        **extra,
    }
    return json.dumps({k: v for k, v in obj.items() if v is not ...})


# ----------------------------------------------------------------------------- Mooncake, real file


@pytest.fixture(scope="module")
def mooncake_records() -> list[dict]:
    with MOONCAKE.open() as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def mooncake_requests(mooncake_records) -> list[Request]:
    return read_mooncake(MOONCAKE)


def test_mooncake_counts_and_lengths(mooncake_records, mooncake_requests) -> None:
    assert len(mooncake_requests) == SAMPLE_REQUESTS
    for rec, r in zip(mooncake_records, mooncake_requests, strict=True):
        assert r.prompt_len == rec["input_length"]
        assert r.output_len == rec["output_length"]
        assert r.arrival_time == rec["timestamp"] / 1000
        assert r.meta["hash_ids"] == rec["hash_ids"]
        assert r.prompt.dtype == np.int32
    assert all(r.prompt.min() >= 0 and r.prompt.max() < 32000 for r in mooncake_requests)
    assert len({r.request_id for r in mooncake_requests}) == SAMPLE_REQUESTS


def test_mooncake_equal_hash_ids_mean_equal_blocks(mooncake_records, mooncake_requests) -> None:
    by_first: dict[int, list[int]] = {}
    for i, rec in enumerate(mooncake_records):
        by_first.setdefault(rec["hash_ids"][0], []).append(i)
    pairs_checked = 0
    for members in by_first.values():
        for i, j in itertools.pairwise(members):
            hi, hj = mooncake_records[i]["hash_ids"], mooncake_records[j]["hash_ids"]
            k = 0
            while k < min(len(hi), len(hj)) and hi[k] == hj[k]:
                k += 1
            a, b = mooncake_requests[i].prompt, mooncake_requests[j].prompt
            full = min(k * 512, a.size, b.size)
            assert np.array_equal(a[:full], b[:full])
            if k < min(len(hi), len(hj)):  # the first differing block differs in content
                assert not np.array_equal(a[k * 512 : k * 512 + 16], b[k * 512 : k * 512 + 16])
            pairs_checked += 1
    assert pairs_checked >= 10  # 16 pairs share a first block in the 400-request sample


def test_mooncake_seed_and_limit(mooncake_requests) -> None:
    first = read_mooncake(MOONCAKE, limit=5)
    assert same(first, mooncake_requests[:5])
    other = read_mooncake(MOONCAKE, limit=5, seed=1)
    assert [r.prompt_len for r in other] == [r.prompt_len for r in first]
    assert not np.array_equal(other[0].prompt, first[0].prompt)
    assert read_mooncake(MOONCAKE, limit=0) == []


def test_mooncake_stats(mooncake_records, mooncake_requests) -> None:
    start = time.perf_counter()
    stats = trace_stats(mooncake_requests)
    elapsed = time.perf_counter() - start
    assert elapsed < 15  # ~1 s on 2 cores
    assert stats.num_requests == SAMPLE_REQUESTS
    assert stats.prompt_tokens_total == sum(r["input_length"] for r in mooncake_records)
    assert stats.output_tokens_total == sum(r["output_length"] for r in mooncake_records)
    assert stats.arrival_span_s == mooncake_records[-1]["timestamp"] / 1000
    assert 0 < stats.cacheable_prefix_share <= stats.shared_prefix_share < 1
    # Block-level reference from hash_ids alone: leading blocks already seen (chained ids).
    chain: dict[tuple[int, int], int] = {}
    block_level = 0
    for rec in sorted(mooncake_records, key=lambda r: r["timestamp"]):
        node, hits, missed = 0, 0, False
        for h in rec["hash_ids"]:
            nxt = chain.get((node, h))
            if nxt is None:
                missed = True
                nxt = chain[(node, h)] = len(chain) + 1
            elif not missed:
                hits += 1
            node = nxt
        block_level += min(hits * 512, rec["input_length"])
    # token-level is exact; it can exceed the block count only by chance token matches
    slack = 0.0001 * stats.prompt_tokens_total
    assert block_level <= stats.cacheable_prefix_tokens <= block_level + slack


def test_trace_workload_on_mooncake() -> None:
    w = make_workload(f"trace:{MOONCAKE}", limit=20)
    assert isinstance(w, TraceWorkload)
    requests = w.generate(0)
    assert len(requests) == 20
    assert [r.arrival_time for r in requests] == sorted(r.arrival_time for r in requests)
    assert detect_format(MOONCAKE) == "mooncake"


# ----------------------------------------------------------------------------- Mooncake, errors


@pytest.mark.parametrize(
    ("line", "field", "problem"),
    [
        ('{"timestamp": 0, "input_length": 10', None, "invalid JSON"),
        ("[1, 2, 3]", None, "expected a JSON object"),
        (mc_line(timestamp=None), "timestamp", "expected a number"),
        (
            json.dumps({"input_length": 10, "output_length": 1, "hash_ids": [1]}),
            "timestamp",
            "missing",
        ),
        (mc_line(timestamp=-5), "timestamp", "must be finite and >= 0"),
        (mc_line(timestamp="12"), "timestamp", "expected a number"),
        (mc_line(timestamp=True), "timestamp", "expected a number"),
        (mc_line(input_length=-1), "input_length", "must be >= 1"),
        (mc_line(input_length=10.5), "input_length", "expected an integer"),
        (mc_line(output_length=0), "output_length", "must be >= 1"),
        (mc_line(output_length="5"), "output_length", "expected an integer"),
        (mc_line(hash_ids=(1, 2, 3)), "hash_ids", "needs ceil(1000/512) = 2 blocks"),
        (mc_line(hash_ids=(1,)), "hash_ids", "has 1 ids"),
        (mc_line(hash_ids=7), "hash_ids", "expected a list of integers"),
        (mc_line(hash_ids=[1, "x"]), "hash_ids[1]", "expected an integer"),
        (mc_line(hash_ids=[1, -2]), "hash_ids[1]", "must be >= 0"),
        (mc_line(hash_ids=[1, 2**70]), "hash_ids[1]", "out of range"),
        (
            json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1}),
            "hash_ids",
            "missing: a Mooncake line needs hash_ids, one id per 512-token block",
        ),
        # magnitudes no real trace has, each refused with the reason
        (mc_line(input_length=10**9), "input_length", "over 10,000,000 tokens"),
        (mc_line(output_length=10**8), "output_length", "over any model's context"),
        (mc_line(timestamp=1e14), "timestamp", "1e+14 ms is over 1e+13 ms: centuries"),
    ],
)
def test_mooncake_malformed_lines(
    tmp_path: Path, line: str, field: str | None, problem: str
) -> None:
    path = write_lines(tmp_path / "bad_trace.jsonl", [mc_line(), "   ", line, mc_line()])
    with pytest.raises(TraceFormatError) as info:
        read_mooncake(path)
    message = str(info.value)
    assert "bad_trace.jsonl" in message
    assert "line 3" in message
    assert problem in message
    if field is not None:
        assert f"field {field!r}" in message
    assert info.value.line == 3 and info.value.field == field
    assert isinstance(info.value, ValueError)


def test_mooncake_small_file_details(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            mc_line(timestamp=1500, input_length=600, hash_ids=(4, 9), extra_field="ok"),
            "",
            "\t ",
            mc_line(timestamp=2500, input_length=512, hash_ids=(4,)),
            mc_line(timestamp=2500, input_length=3, output_length=1, hash_ids=(9,)),
        ],
    )
    a, b, c = read_mooncake(path)
    assert (a.arrival_time, b.arrival_time) == (1.5, 2.5)
    assert (a.prompt_len, b.prompt_len, c.prompt_len) == (600, 512, 3)
    assert np.array_equal(a.prompt[:512], b.prompt)  # same id 4, same block
    assert np.array_equal(a.prompt[512:515], c.prompt)  # id 9, cut to 88 and to 3 tokens
    assert [r.meta["line"] for r in (a, b, c)] == [1, 4, 5]
    blocks = read_mooncake(
        write_lines(tmp_path / "b.jsonl", [mc_line(input_length=600, hash_ids=(4, 9, 1))]),
        block_size=256,
        vocab_size=5,
    )
    assert blocks[0].prompt_len == 600 and blocks[0].prompt.max() < 5


def test_error_is_picklable() -> None:
    err = TraceFormatError("f.jsonl", 7, "prompt", "boom")
    copy = pickle.loads(pickle.dumps(err))
    assert str(copy) == str(err) and copy.line == 7 and copy.field == "prompt"


# ----------------------------------------------------------------------------- feather JSONL


def test_jsonl_round_trip_generated(tmp_path: Path) -> None:
    requests = SharedPrefixWorkload(
        num_groups=3, prompts_per_group=4, system_prompt_len=30, question_len=5,
        arrival="poisson:3.3",
    ).generate(5)  # fmt: skip
    path = tmp_path / "out.jsonl"
    write_jsonl(path, requests)
    back = read_jsonl(path)
    assert same(back, requests)
    assert same(read_trace(path), requests)
    assert detect_format(path) == "jsonl"
    assert same(read_jsonl(path, limit=2), requests[:2])
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"id", "arrival", "output_len", "prompt", "group", "meta", "max_tokens"}


def _line(**fields) -> str:
    return json.dumps({"id": "r", "arrival": 0.0, "output_len": 64, "prompt": [1, 2], **fields})


@pytest.mark.parametrize(
    ("fields", "cap", "firm"),
    [({}, 256, False), ({"max_tokens": 100}, 100, False), ({"ignore_eos": True}, 64, True)],
)
def test_jsonl_caps_default_or_given(tmp_path: Path, fields: dict, cap: int, firm: bool) -> None:
    """A line's own cap, else a client's default above its output (its output under
    ignore_eos)."""
    path = tmp_path / "t.jsonl"
    path.write_text(_line(**fields) + "\n")
    (r,) = read_jsonl(path)
    assert (r.max_tokens, r.ignore_eos) == (cap, firm)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"max_tokens": 63}, "must be >= 64"),
        ({"max_tokens": 128, "ignore_eos": True}, "must equal output_len"),
        ({"ignore_eos": "yes"}, "expected true or false"),
    ],
)
def test_jsonl_bad_caps_are_named(tmp_path: Path, fields: dict, says: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(_line(**fields) + "\n")
    with pytest.raises(TraceFormatError, match=says):
        read_jsonl(path)


requests_strategy = st.lists(
    st.builds(
        lambda i, prompt, out, arrival, group, meta: Request(
            f"req-{i}", np.array(prompt, dtype=np.int32), out, arrival, group, meta
        ),
        st.integers(0, 10**6),
        st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=20),
        st.integers(1, 10**6),
        st.floats(0, 1e9, allow_nan=False, allow_infinity=False),
        st.none() | st.text(max_size=8),
        st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
    ),
    max_size=8,
    unique_by=lambda r: r.request_id,
)


@settings(max_examples=60, deadline=None)
@given(requests=requests_strategy)
def test_jsonl_round_trip_property(tmp_path_factory, requests: list[Request]) -> None:
    path = tmp_path_factory.mktemp("prop") / "prop.jsonl"
    write_jsonl(path, requests)
    assert same(read_jsonl(path), requests)


def jl(**fields) -> str:
    base = {"id": "a", "arrival": 0.5, "output_len": 3, "prompt": [1, 2, 3]}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


@pytest.mark.parametrize(
    ("line", "field", "problem"),
    [
        ("{not json", None, "invalid JSON"),
        ('"just a string"', None, "expected a JSON object"),
        (jl(id=...), "id", "missing"),
        (jl(id=""), "id", "non-empty string"),
        (jl(id=5), "id", "non-empty string"),
        (jl(arrival=...), "arrival", "missing"),
        (jl(arrival=-1.0), "arrival", "must be finite and >= 0"),
        (jl(arrival="soon"), "arrival", "expected a number"),
        (jl(output_len=0), "output_len", "must be >= 1"),
        (jl(output_len=2.0), "output_len", "expected an integer"),
        (jl(prompt=...), "prompt", "missing"),
        (jl(prompt="1 2 3"), "prompt", "expected a list of integers"),
        (jl(prompt=[]), "prompt", "at least one token"),
        (jl(prompt=[1, 2.0]), "prompt[1]", "expected an integer"),
        (jl(prompt=[1, True]), "prompt[1]", "expected an integer"),
        (jl(prompt=[0, 0, -3]), "prompt[2]", "must be in [0, 2147483647]"),
        (jl(prompt=[2**31]), "prompt[0]", "must be in [0, 2147483647]"),
        (jl(group=3), "group", "expected a string or null"),
        (jl(meta=[1]), "meta", "expected an object"),
        (jl(output_length=3), "output_length", "unknown field"),
        (jl(output_len=10**12), "output_len", "1,000,000,000,000 is over 10,000,000 tokens"),
        (jl(arrival=1.7e12), "arrival", "1.7e+12 s is over 1e+10 s"),  # ms since 1970
        (jl(id="first"), "id", "duplicate id 'first' (first used on line 1)"),
    ],
)
def test_jsonl_malformed_lines(tmp_path: Path, line: str, field: str | None, problem: str) -> None:
    path = write_lines(tmp_path / "mine.jsonl", [jl(id="first"), "", line, jl(id="last")])
    with pytest.raises(TraceFormatError) as info:
        read_jsonl(path)
    message = str(info.value)
    assert "mine.jsonl" in message
    assert "line 3" in message
    assert problem in message
    if field is not None:
        assert f"field {field!r}" in message


def test_a_mooncake_trace_without_hash_ids_says_so(tmp_path: Path) -> None:
    """Read as Mooncake (its fields, none of ours), so the message names the missing
    hash_ids instead of calling input_length an unknown JSONL field."""
    path = write_lines(tmp_path / "lengths.jsonl", ['{"timestamp": 0, "input_length": 700, '
                                                    '"output_length": 4}'])  # fmt: skip
    assert detect_format(path) == "mooncake"
    with pytest.raises(TraceFormatError, match="field 'hash_ids': missing: a Mooncake line"):
        read_trace(path)
    assert detect_format(write_lines(tmp_path / "own.jsonl", [jl(timestamp=3)])) == "jsonl"


def test_a_prompt_no_model_can_hold_is_refused(tmp_path: Path, monkeypatch) -> None:
    from feather_lab.workloads import traces

    monkeypatch.setattr(traces, "MAX_TRACE_TOKENS", 4)  # 10M tokens would be a 80 MB line
    path = write_lines(tmp_path / "long.jsonl", [jl(prompt=[1, 2, 3, 4, 5])])
    with pytest.raises(TraceFormatError, match="field 'prompt': 5 tokens is over 4: over any"):
        read_jsonl(path)


def test_jsonl_null_group_and_blank_lines(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "g.jsonl", ["", jl(group=None), "  ", jl(id="b", arrival=0)])
    a, b = read_jsonl(path)
    assert a.group is None and b.arrival_time == 0.0 and isinstance(b.arrival_time, float)


def test_write_jsonl_refuses_duplicates_and_bad_meta(tmp_path: Path) -> None:
    r = Request("x", np.array([1], dtype=np.int32), 1)
    with pytest.raises(ValueError, match="duplicate request id 'x'"):
        write_jsonl(tmp_path / "d.jsonl", [r, r])
    bad = Request("y", np.array([1], dtype=np.int32), 1, meta={"v": object()})
    with pytest.raises(ValueError, match="request 'y': meta is not JSON-serializable"):
        write_jsonl(tmp_path / "m.jsonl", [bad])


# ----------------------------------------------------------------------------- detection, registry


def test_read_trace_detection(tmp_path: Path) -> None:
    mc = write_lines(tmp_path / "mc.jsonl", ["", mc_line(input_length=5, hash_ids=(3,))])
    own = write_lines(tmp_path / "own.jsonl", [jl()])
    empty = write_lines(tmp_path / "empty.jsonl", ["", "   "])
    assert [r.request_id for r in read_trace(mc)] == ["mc-000000"]
    assert read_trace(mc, block_size=8, seed=3)[0].prompt_len == 5
    assert [r.request_id for r in read_trace(own)] == ["a"]
    assert read_trace(empty) == []
    assert detect_format(empty) is None
    with pytest.raises(ValueError, match="block_size apply only to Mooncake"):
        read_trace(own, block_size=16)


def test_trace_workload_sorts_and_reads_jsonl(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "w.jsonl",
        [jl(id="late", arrival=2.0), jl(id="early", arrival=1.0), jl(id="tie", arrival=2.0)],
    )
    assert [r.request_id for r in read_jsonl(path)] == ["late", "early", "tie"]  # file order
    w = make_workload(f"trace:{path}")
    assert [r.request_id for r in w.generate(0)] == ["early", "late", "tie"]  # stable sort


def test_trace_workload_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="trace file not found"):
        make_workload(f"trace:{tmp_path / 'missing.jsonl'}")
    path = write_lines(tmp_path / "x.jsonl", [jl()])
    with pytest.raises(ValueError, match=r"no field.*shuffle.*valid fields: block_size"):
        make_workload(f"trace:{path}", shuffle=False)
    with pytest.raises(ValueError, match="limit must be >= 0"):
        make_workload(f"trace:{path}", limit=-1)
