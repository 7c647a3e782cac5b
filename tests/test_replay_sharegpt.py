"""`feather replay --dataset-name sharegpt --dataset-path FILE --tokenizer NAME`: ShareGPT
conversations sampled by vLLM's rules (replay/sharegpt.py), from tests/data/sharegpt_tiny.json
(one entry per rule) through the built-in tiny-llama's real tokenizer, checked against vLLM's
own `ShareGPTDataset` where vLLM is installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feather_lab.cli import app
from feather_lab.replay.sharegpt import load_conversations, sharegpt_requests
from replay_server import FakeServer

FIXTURE = Path(__file__).parent / "data" / "sharegpt_tiny.json"
NEVER = "http://127.0.0.1:9"  # a URL no check may reach: the file is refused first


def _entries() -> dict[str, list[dict]]:
    return {e["id"]: e.get("conversations") for e in json.loads(FIXTURE.read_text())}


def _first_two(entry_id: str) -> tuple[str, str]:
    turns = _entries()[entry_id]
    return turns[0]["value"], turns[1]["value"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    pytest.importorskip("transformers", reason="--tokenizer loads through transformers")
    from feather_lab.harness.tiny_llama import TINY_LLAMA, _write_tokenizer
    from feather_lab.replay.tokenizer import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-tokenizer")
    _write_tokenizer(path, TINY_LLAMA.vocab_size, TINY_LLAMA.max_position_embeddings)
    return path, load_tokenizer(str(path))


def _replay(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["replay", *args])
    return result.exit_code, result.stdout + result.stderr


def test_entries_without_two_turns_do_not_count() -> None:
    pairs = load_conversations(FIXTURE)
    counted = [k for k, turns in _entries().items() if turns and len(turns) >= 2]
    assert pairs == [_first_two(k) for k in counted]
    assert len(pairs) == 8


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read"),
        ("{not json", "not JSON"),
        ('{"conversations": []}', "JSON list"),
        ('[{"conversations": [{"value": "a"}]}]', "no entry"),
        ('[{"conversations": [{"from": "human"}, {"value": "b"}]}]', "entry 0"),
    ],
)
def test_a_bad_file_exits_2_naming_it_before_any_server(tmp_path, content, says) -> None:
    path = tmp_path / "conversations.json"
    if content is not None:
        path.write_text(content)
    args = ["--dataset-name", "sharegpt", "--dataset-path", str(path), "--tokenizer", "x"]
    code, out = _replay(NEVER, *args, "--json", str(tmp_path / "r.json"))
    assert code == 2 and str(path) in out and says in out, out


def test_sharegpt_options_go_together(tmp_path) -> None:
    out_json = ["--json", str(tmp_path / "r.json")]
    for args, says in (
        (["--dataset-name", "sharegpt", "--tokenizer", "x"], "--dataset-path"),
        (["--dataset-name", "sharegpt", "--dataset-path", str(FIXTURE)], "--tokenizer"),
        (["--dataset-name", "random", "--dataset-path", str(FIXTURE)], "--dataset-path"),
        (["--dataset-path", str(FIXTURE)], "--dataset-name sharegpt"),
    ):
        code, out = _replay(NEVER, *args, *out_json)
        assert code == 2 and says in out, (args, out)


def test_sampling_keeps_vllms_bounds(tokenizer) -> None:
    _, tok = tokenizer
    reqs = sharegpt_requests(FIXTURE, tok, 20, seed=0, output_len=None)
    valid = {_first_two(k)[0] for k in ("a", "three-turns", "b", "c")}
    assert len(reqs) == 20 and {r.meta["text"] for r in reqs} == valid  # oversampled
    assert len({r.request_id for r in reqs}) == 20
    for r in reqs:
        completion = next(c for p, c in load_conversations(FIXTURE) if p == r.meta["text"])
        assert r.output_len == len(completion.split())
        assert r.prompt.tolist() == tok(r.meta["text"]).input_ids
    fixed = sharegpt_requests(FIXTURE, tok, 20, seed=0, output_len=3)
    assert _first_two("short-answer")[0] in {r.meta["text"] for r in fixed}
    assert {r.output_len for r in fixed} == {3}


@pytest.mark.vllm
@pytest.mark.parametrize(("num", "seed", "output_len"), [(3, 0, None), (9, 5, None), (6, 1, 5)])
def test_sampling_is_vllms_own(tokenizer, num, seed, output_len) -> None:
    """Same prompts, same order, same output lengths as vLLM's ShareGPTDataset."""
    datasets = pytest.importorskip("vllm.benchmarks.datasets.datasets", reason="needs vLLM")
    _, tok = tokenizer
    theirs = datasets.ShareGPTDataset(random_seed=seed, dataset_path=str(FIXTURE)).sample(
        tokenizer=tok, num_requests=num, output_len=output_len
    )
    ours = sharegpt_requests(FIXTURE, tok, num, seed=seed, output_len=output_len)
    assert [(r.meta["text"], r.output_len, r.prompt_len) for r in ours] == [
        (s.prompt, s.expected_output_len, s.prompt_len) for s in theirs
    ]


def test_command_sends_the_conversations_as_text(tokenizer, tmp_path) -> None:
    path, tok = tokenizer
    out = tmp_path / "r.json"
    args = ["--dataset-name", "sharegpt", "--dataset-path", str(FIXTURE), "--tokenizer", str(path)]
    with FakeServer() as server:
        code, text = _replay(server.url, *args, "--num-prompts", "5", "--json", str(out))
        seen = server.seen
    assert code == 0, text
    expected = sharegpt_requests(FIXTURE, tok, 5, seed=0, output_len=None)
    # all sent at once (rate inf): they reach the server in any order
    assert sorted((s["prompt"], s["max_tokens"]) for s in seen) == sorted(
        (r.meta["text"], r.output_len) for r in expected
    )
    row = json.loads(out.read_text())["rows"][0]
    assert row["completed"] == 5
    # the server's own prompt count, as vLLM's client takes it (the fake server counts
    # characters of a text prompt)
    assert row["total_input_tokens"] == sum(len(r.meta["text"]) for r in expected)


def test_random_prompts_go_as_text_through_the_tokenizer(tokenizer, tmp_path) -> None:
    """With --tokenizer, a random dataset's prompts are the text of its ids, as vLLM's client
    sends them, each the requested length through the tokenizer."""
    path, tok = tokenizer
    args = ["--dataset-name", "random", "--num-prompts", "6", "--random-input-len", "24"]
    args += ["--random-output-len", "3", "--tokenizer", str(path)]
    with FakeServer() as server:
        code, text = _replay(server.url, *args, "--json", str(tmp_path / "r.json"))
        seen = server.seen
    assert code == 0, text
    assert len(seen) == 6 and all(isinstance(s["prompt"], str) for s in seen)
    assert all(len(tok(s["prompt"], add_special_tokens=False).input_ids) == 24 for s in seen)
