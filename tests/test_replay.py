"""`feather replay`'s client against a real local HTTP server (tests/replay_server.py): the
schedule kept, every request answered once, faults counted as data, the A/B aggregation, and
the command's own errors, Ctrl-C and records. The real `vllm serve` runs are in
test_replay_vllm.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("httpx", reason="feather replay needs httpx (the 'replay' extra)")

from typer.testing import CliRunner

from feather_lab.cli import app
from feather_lab.replay.client import ClientOptions, Endpoint, EndpointError, Outcome, preflight
from feather_lab.replay.runner import ReplaySpec, run_ab, run_once, summarize
from feather_lab.replay.summary import run_row
from feather_lab.replay.transport import HTTP_CLIENT
from feather_lab.replay.workload import ReplayWorkload
from feather_lab.sim.result import SLO
from feather_sched.request import Request
from replay_server import DROP, REJECT, STALL, FakeServer

SRC = Path(__file__).resolve().parents[1] / "src"
CUT = {"httpx": "RemoteProtocolError", "aiohttp": "ClientPayloadError"}[HTTP_CLIENT]
"""How the streaming library names a stream cut mid-answer (replay/transport.py)."""


def _requests(n: int, fates: dict[int, int] | None = None, gap_s: float = 0.0) -> list[Request]:
    """n requests of distinct prompts (first token 10 + i unless `fates` gives it) and
    output lengths 3..7, arriving `gap_s` apart."""
    fates = fates or {}
    return [
        Request(
            f"r{i}",
            np.array([fates.get(i, 10 + i), 5, 6, 7 + i], dtype=np.int32),
            3 + i % 5,
            arrival_time=i * gap_s,
        )
        for i in range(n)
    ]


def _work(requests: list[Request], name: str = "w") -> ReplayWorkload:
    return ReplayWorkload(name, requests, 0, {})


def _endpoint(server: FakeServer) -> Endpoint:
    return preflight(server.url)


def test_every_request_answered_once_with_its_length_and_prompt() -> None:
    reqs = _requests(12)
    with FakeServer() as server:
        row = run_once(_endpoint(server), "A", _work(reqs), ReplaySpec(("A",)))
    assert sorted(tuple(s["prompt"]) for s in server.seen) == sorted(
        tuple(r.prompt.tolist()) for r in reqs
    )
    assert sorted((s["prompt"][0], s["max_tokens"]) for s in server.seen) == sorted(
        (int(r.prompt[0]), r.output_len) for r in reqs
    )
    assert all(s["ignore_eos"] and s["stream"] for s in server.seen)
    assert (row["requests"], row["sent"], row["finished"], row["failed"]) == (12, 12, 12, 0)
    assert row["output_tokens"] == sum(r.output_len for r in reqs)
    assert row["ttft_p50_s"] is not None and row["latency_p99_s"] >= row["ttft_p99_s"]
    # the fake server's counters, as the row reads them: queries are its prompt tokens
    assert row["server_prefix_cache_queries"] == sum(r.prompt_len for r in reqs)
    assert row["server_prefix_hit_rate"] == 0.5


def test_schedule_is_kept_however_slow_the_server() -> None:
    """16 requests at once to a server taking ~0.6 s each: all are sent at once (the client
    does not wait for answers: all 16 in flight together, each sent before one request's
    time had passed), so the run takes about one request's time, not 16. (The lag's bound
    is one request's time, not an absolute figure: on a fresh CI clone the lag read 0.39 s,
    likely cold code on the client's first streamed request.)"""
    reqs = [Request(f"r{i}", np.array([10 + i, 5]), 6) for i in range(16)]
    with FakeServer(token_delay_s=0.1) as server:
        row = run_once(_endpoint(server), "A", _work(reqs), ReplaySpec(("A",)))
    assert row["finished"] == 16 and server.peak == 16
    assert row["max_send_lag_s"] < 0.6
    assert row["makespan_s"] < 4 * 0.6


def test_arrival_times_are_kept_and_concurrency_capped() -> None:
    reqs = _requests(10, gap_s=0.05)
    spec = ReplaySpec(("A",), client=ClientOptions(max_concurrency=2))
    with FakeServer(token_delay_s=0.05) as server:
        row = run_once(_endpoint(server), "A", _work(reqs), spec)
    assert row["finished"] == 10 and server.peak <= 2


def test_rejected_dropped_and_stalled_requests_are_counted_and_the_run_goes_on() -> None:
    reqs = _requests(9, fates={1: REJECT, 4: DROP, 7: STALL})
    spec = ReplaySpec(("A",), client=ClientOptions(request_timeout_s=0.5))
    with FakeServer(stall_s=3.0) as server:
        row = run_once(_endpoint(server), "A", _work(reqs), spec)
    assert (row["sent"], row["finished"], row["failed"]) == (9, 6, 3)
    assert row["failed_by"] == {"http 503": 1, CUT: 1, "timeout": 1}
    assert row["output_tokens"] == sum(
        r.output_len for i, r in enumerate(reqs) if i not in (1, 4, 7)
    )


def test_a_stalled_server_is_reported_with_what_was_sent_and_received() -> None:
    reqs = _requests(4, fates={i: STALL for i in range(4)})
    spec = ReplaySpec(("A",), client=ClientOptions(request_timeout_s=0.4))
    with FakeServer(stall_s=2.0) as server:
        start = time.perf_counter()
        row = run_once(_endpoint(server), "A", _work(reqs), spec)
        took = time.perf_counter() - start  # before the server's shutdown waits out the stall
    assert took < 2.0  # the timeout, not the stall, ended the run
    assert (row["sent"], row["finished"], row["failed"]) == (4, 0, 4)
    assert row["first_error"] == "timeout: no data after 1 chunks"


def test_preflight_refuses_an_unreachable_url_and_a_wrong_api() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EndpointError, match="unreachable"):
        preflight(f"http://127.0.0.1:{port}")
    with FakeServer(models_status=404) as server, pytest.raises(EndpointError, match="not an"):
        preflight(server.url)
    with pytest.raises(EndpointError, match="not an http"):
        preflight("localhost:8000")


def test_no_metrics_endpoint_gives_fewer_fields_not_an_error() -> None:
    with FakeServer(metrics=False) as server:
        row = run_once(_endpoint(server), "A", _work(_requests(3)), ReplaySpec(("A",)))
    assert row["finished"] == 3
    assert not [k for k in row if k.startswith("server_")]


def test_ab_interleaves_servers_and_reports_medians_and_b_over_a() -> None:
    reqs = _requests(6)
    with FakeServer() as a, FakeServer(token_delay_s=0.1) as b:  # >= 0.3 s a request
        spec = ReplaySpec(("fast", "slow"), repeats=3)
        runs = run_ab([_endpoint(a), _endpoint(b)], [_work(reqs)], spec)
    assert [r["policy"] for r in runs] == ["fast", "slow", "slow", "fast", "fast", "slow"]
    assert len(a.seen) == len(b.seen) == 18
    rows, ab = summarize(runs, ("fast", "slow"))
    assert [r["policy"] for r in rows] == ["fast", "slow"]
    slow = rows[1]
    assert slow["repeats"] == 3 and len(slow["output_tok_s_runs"]) == 3
    tput = next(e for e in ab if e["metric"] == "output_tok_s")
    ratio = slow["output_tok_s"] / rows[0]["output_tok_s"]
    assert tput["b_over_a"] == pytest.approx(ratio, abs=1e-3)  # rounded to 3 decimals
    assert tput["b_over_a"] < 1 and slow["vs_fcfs"] == tput["b_over_a"]


def _outcome(i: int, kind: str) -> Outcome:
    out = Outcome(f"r{i}", 4, 3, 0.0)
    if kind == "unsent":
        return out
    out.sent_s = 0.1 * i
    if kind == "failed":
        out.error = "HTTP 500: x"
        out.status = 500
    elif kind == "done":
        out.chunk_s = [out.sent_s + 0.1, out.sent_s + 0.2, out.sent_s + 0.3]
        out.tokens, out.done_s = 3, out.sent_s + 0.3
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["done", "failed", "open", "unsent"]), max_size=30))
def test_every_request_is_counted_once(kinds: list[str]) -> None:
    """finished + failed + unanswered (sent or not) = requests, whatever mix a cut-short
    run leaves; goodput never counts more than finished."""
    outcomes = [_outcome(i, k) for i, k in enumerate(kinds)]
    row = run_row("w", "A", outcomes, SLO(ttft_s=0.15))
    assert row["finished"] == kinds.count("done") and row["failed"] == kinds.count("failed")
    assert row["finished"] + row["failed"] + row["unanswered"] == row["requests"] == len(kinds)
    assert row["sent"] == len(kinds) - kinds.count("unsent")
    assert row["goodput_req_s"] * row["makespan_s"] <= row["finished"] + 1e-3  # rounded


def _replay(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["replay", *args])
    return result.exit_code, result.stdout, result.stderr


def test_command_writes_a_record_show_and_compare_read(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with FakeServer() as a, FakeServer() as b:
        args = [a.url, b.url, "--label", "vllm,feather", "--model", "tiny-llama"]
        code, stdout, _ = _replay(*args, "-w", "no-sharing", "--limit", "4", "--json", str(out))
    assert code == 0, stdout
    record = json.loads(out.read_text())
    assert [r["policy"] for r in record["rows"]] == ["vllm", "feather"]
    assert all(r["finished"] == 4 and r["output_tokens"] == 4 * 64 for r in record["rows"])
    assert {e["metric"] for e in record["ab"]} >= {"output_tok_s", "ttft_p99_s", "tpot_p99_s"}
    assert "feather / vllm" in stdout
    shown = CliRunner().invoke(app, ["show", str(out)])
    assert shown.exit_code == 0 and "feather" in shown.stdout
    compared = CliRunner().invoke(app, ["compare", str(out), str(out)])
    assert compared.exit_code == 0, compared.output


def test_command_bad_endpoints_exit_2_before_any_run(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "r.json"
    code, _, err = _replay(f"http://127.0.0.1:{port}", "-w", "no-sharing", "--json", str(out))
    assert code == 2 and "unreachable" in err and not out.exists()
    with FakeServer(models_status=404) as server:
        code, _, err = _replay(server.url, "-w", "no-sharing", "--json", str(out))
        assert code == 2 and "not an OpenAI-compatible server" in err
        assert not server.seen
    with FakeServer() as server:
        code, _, err = _replay(server.url, "--model", "tiny-llama", "-w", "nope")
        assert code == 2 and "unknown workload 'nope'" in err and not server.seen
        code, _, err = _replay(server.url, server.url, "--label", "a", "-w", "no-sharing")
        assert code == 2 and "--label" in err
        code, _, err = _replay(server.url, "--model", "banana", "-w", "no-sharing")
        assert code == 2 and "--model 'banana'" in err and "tiny-llama" in err
    with FakeServer(vocab=512) as server:  # a 512-token model asked for ids up to 31,999
        code, _, err = _replay(server.url, "--vocab-size", "32000", "-w", "no-sharing")
        assert code == 2 and "refuses token id 31,99" in err and "--vocab-size" in err
        assert not server.seen


def test_command_failures_are_rows_and_the_record_is_written(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with FakeServer(stall_s=2.0) as server:
        code, stdout, err = _replay(
            server.url, "--vocab-size", "4", "-w", "no-sharing", "--limit", "3",
            "--request-timeout", "0.5", "--json", str(out),
        )  # fmt: skip
    # vocab 4: each prompt starts with 0 (answered), 1 (REJECT), 2 (DROP) or 3 (STALL);
    # failures past --max-failed (1%) exit 1 after the record is written, with the first
    assert code == 1, stdout
    assert "requests failed in 1 of 1 runs" in err and "first:" in err
    firsts = [s["prompt"][0] for s in server.seen]
    row = json.loads(out.read_text())["rows"][0]
    assert len(firsts) == row["sent"] == 3 and row["finished"] == firsts.count(0)
    assert row["failed"] == 3 - firsts.count(0) >= 1


def test_ctrl_c_keeps_the_finished_runs(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    # runs of 2 requests, 2 s apart, ~0.3 s each: the third answer ends the second run's
    # first request, so the signal lands while that run waits for its second (the 1.7 s
    # between keep it there on a loaded machine; 0.5 s apart failed under load)
    with FakeServer(token_delay_s=0.005) as server:
        cmd = [sys.executable, "-m", "feather_lab.cli", "replay", server.url,
               "--model", "tiny-llama", "-w", "no-sharing", "--limit", "2",
               "--arrival", "bursts:1:2", "--repeats", "50", "--json", str(out)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while server.answered < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr.decode()
    record = json.loads(out.read_text())
    assert record["interrupted"] is True
    assert [r["finished"] for r in record["runs"]] == [2, 1]
    assert record["runs"][-1].get("interrupted") is True and record["runs"][-1]["sent"] == 1


def test_metrics_text_is_summed_over_label_sets_and_counters_become_deltas() -> None:
    from feather_lab.replay.metrics import metric_fields, parse_metrics

    text = (
        "# HELP vllm:num_preemptions_total x\n# TYPE vllm:num_preemptions_total counter\n"
        'vllm:num_preemptions_total{engine="0",model_name="a b"} 3.0\n'
        'vllm:num_preemptions_total{engine="1",model_name="a b"} 2.0\n'
        "vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 40 1700000000\n"
        "garbage line\n"
    )
    before = parse_metrics(text)
    assert before["vllm:num_preemptions_total"] == 5.0
    after = {**before, "vllm:prefix_cache_queries_total": 300.0}
    after["vllm:prefix_cache_hits_total"] = 140.0
    fields = metric_fields(before, after, [{"running": 2.0}, {"running": 4.0, "waiting": 1.0}])
    assert fields["server_preemptions"] == 0 and fields["server_prefix_hit_rate"] == 0.5
    assert (fields["server_running_mean"], fields["server_running_max"]) == (3.0, 4.0)
    assert fields["server_waiting_max"] == 1.0
    assert metric_fields(None, after, []) == {}


@pytest.mark.parametrize(
    ("model", "name"), [("kv-bound", "paper-32g"), ("tiny-llama", "no-sharing")]
)
def test_a_built_in_model_gets_the_in_process_benchs_very_requests(model: str, name: str) -> None:
    from feather_lab.bench.suite import BenchSpec
    from feather_lab.harness.tiny_llama import ENGINE_MODELS
    from feather_lab.harness.vllm_spec import ENGINE_SCALES, engine_workload
    from feather_lab.replay.workload import replay_workloads

    scale = ENGINE_SCALES[model]
    (work,) = replay_workloads(BenchSpec(workloads=[name]), model, None, scale.max_model_len)
    bench = engine_workload(name, ENGINE_MODELS[model].vocab_size, 0, scale)
    assert [r.request_id for r in work.requests] == [r.request_id for r in bench]
    for a, b in zip(work.requests, bench):
        assert np.array_equal(a.prompt, b.prompt) and a.output_len == b.output_len


def test_stream_interval_is_asked_for_and_keeps_counts_and_tpot() -> None:
    """With `stream_interval` 8 the server sends 3 chunks of 17 tokens instead of 17; every
    token is still counted (usage), TPOT keeps its per-token meaning, ITL becomes per chunk."""
    reqs = [Request(f"r{i}", np.array([10 + i, 5]), 17) for i in range(4)]
    eight = ReplaySpec(("A",), client=ClientOptions(stream_interval=8))
    with FakeServer(token_delay_s=0.02) as server:
        endpoint = _endpoint(server)
        per_token = run_once(endpoint, "A", _work(reqs), ReplaySpec(("A",)))
        chunked = run_once(endpoint, "A", _work(reqs), eight)
    assert not any("stream_interval" in s for s in server.seen[:4])
    assert [s["stream_interval"] for s in server.seen[4:]] == [8] * 4
    for row in (per_token, chunked):
        assert (row["finished"], row["failed"], row["output_tokens"]) == (4, 0, 4 * 17)
        assert row["client_cpu_s"] >= 0
    assert chunked["tpot_p50_s"] == pytest.approx(per_token["tpot_p50_s"], rel=0.5)
    assert chunked["itl_p50_s"] > 4 * per_token["itl_p50_s"]


def test_command_stream_interval_is_sent_and_recorded_and_checked(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with FakeServer() as server:
        args = [server.url, "--model", "tiny-llama", "-w", "no-sharing", "--limit", "2"]
        code, stdout, _ = _replay(*args, "--stream-interval", "4", "--json", str(out))
        assert code == 0, stdout
        assert [s["stream_interval"] for s in server.seen] == [4, 4]
        code, _, err = _replay(*args, "--stream-interval", "0", "--json", str(tmp_path / "x"))
    assert json.loads(out.read_text())["config"]["stream_interval"] == 4
    assert code == 2 and "--stream-interval" in err and len(server.seen) == 2


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_server_cpu_is_split_into_the_process_its_children_and_below() -> None:
    """A parent that sleeps over a child that waits over a grandchild that spins (vLLM's API
    server, engine core, CPU worker): the spinning shows as `worker`, not as `engine` or
    `api`, and in the machine's busy time."""
    from feather_lab.harness.vllm_server import machine_busy_s, process_cpu_s

    spin = "while True: pass"
    middle = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {spin!r}]).wait()"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {middle!r}])"
    cmd = [sys.executable, "-c", parent + "; time.sleep(60)"]
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        busy0, deadline = machine_busy_s(), time.monotonic() + 20
        while process_cpu_s(proc.pid)["worker"] < 1.0 and time.monotonic() < deadline:
            time.sleep(0.2)
        cpu = process_cpu_s(proc.pid)
        assert cpu["worker"] >= 1.0 and cpu["engine"] < 0.5 and cpu["api"] < 0.5
        assert machine_busy_s() - busy0 > 0.5
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_sglang_native_generate_with_its_metrics_and_cache_flush() -> None:
    """SGLang's `/generate` (input_ids, sampling_params) against a local server following
    SGLang's documented format (no SGLang server runs here): each request once with its
    length, faults counted, `sglang:` metrics read, the radix cache flushed first."""
    reqs = _requests(9, fates={1: REJECT, 4: DROP})
    spec = ReplaySpec(("A",), client=ClientOptions(api="generate", stream_interval=2))
    with FakeServer(flavor="sglang") as server:
        row = run_once(_endpoint(server), "A", _work(reqs), spec)
    assert sorted((s["input_ids"][0], s["sampling_params"]["max_new_tokens"]) for s in server.seen)\
        == sorted((int(r.prompt[0]), r.output_len) for r in reqs)  # fmt: skip
    assert all(s["stream"] and s["sampling_params"]["ignore_eos"] for s in server.seen)
    assert all(s["sampling_params"]["stream_interval"] == 2 for s in server.seen)
    assert (row["sent"], row["finished"], row["failed"]) == (9, 7, 2)
    assert row["failed_by"] == {"http 503": 1, CUT: 1}
    assert row["output_tokens"] == sum(r.output_len for i, r in enumerate(reqs) if i not in (1, 4))
    assert row["prefix_cache_reset"] is True and server.flushes == 1
    assert row["server_prefix_cache_queries"] == sum(r.prompt_len for r in reqs)
    assert row["server_prefix_hit_rate"] == 0.5  # device + host cached tokens, summed
    assert row["server_requests_succeeded"] == 9 and "server_running_max" in row


def test_command_api_is_checked_and_recorded(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with FakeServer(flavor="sglang") as server:
        args = [server.url, "--model", "tiny-llama", "-w", "no-sharing", "--limit", "2"]
        code, _, err = _replay(*args, "--api", "chat", "--json", str(out))
        assert code == 2 and "--api 'chat'" in err and not server.seen and not out.exists()
        code, stdout, _ = _replay(*args, "--api", "generate", "--json", str(out))
    assert code == 0, stdout
    record = json.loads(out.read_text())
    assert record["config"]["api"] == "generate"
    assert record["rows"][0]["finished"] == 2 and len(server.seen) == 2


def test_server_layout_is_set_not_inherited(monkeypatch) -> None:
    """A `vllm serve` started after the in-process harness ran in the same process must not
    take that harness's layout and log level from the environment (engine_env_defaults)."""
    from feather_lab.harness.vllm_engine import engine_env_defaults
    from feather_lab.harness.vllm_server import ServerSpec
    from feather_sched.vllm.local import CPU_THREAD_DEFAULTS

    for key in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL", *CPU_THREAD_DEFAULTS):
        monkeypatch.delenv(key, raising=False)  # restored after the test
    engine_env_defaults()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    default = {**os.environ, **ServerSpec("m").environment()}
    in_core = {**os.environ, **ServerSpec("m", model_in_core=True).environment()}
    assert default["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert in_core["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert default["VLLM_LOGGING_LEVEL"] == in_core["VLLM_LOGGING_LEVEL"] == "INFO"


def test_server_scheduler_class_is_feathers_vllms_or_the_one_named() -> None:
    """`--scheduler-cls`: none for vLLM's own, Feather's for `feather`, and a named subclass
    (benchmarks/replay/replay_steps.py's logging schedulers) in place of either."""
    from feather_lab.harness.vllm_server import FEATHER_SCHEDULER, ServerSpec

    def cls(spec: ServerSpec) -> str | None:
        cmd = spec.command(8000)
        return cmd[cmd.index("--scheduler-cls") + 1] if "--scheduler-cls" in cmd else None

    assert cls(ServerSpec("m")) is None
    assert cls(ServerSpec("m", feather=True)) == FEATHER_SCHEDULER
    assert cls(ServerSpec("m", scheduler_cls="steps.Logged")) == "steps.Logged"
    assert cls(ServerSpec("m", feather=True, scheduler_cls="steps.Logged")) == "steps.Logged"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_pin_server_binds_the_api_process_and_everything_below_it() -> None:
    """A parent over a child over a grandchild (API server, engine core, worker): the parent's
    threads on the API CPUs, the two below on the engine's, as /proc reads them back."""
    from feather_lab.harness.vllm_server import pin_server, process_levels

    cpus = sorted(os.sched_getaffinity(0))
    api, engine = {cpus[-1]}, {cpus[0]}
    sleeper = "import time; time.sleep(60)"
    middle = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {sleeper!r}]).wait()"
    parent = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {middle!r}]).wait()"
    proc = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while len(levels := process_levels(proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [len(level) for level in levels] == [1, 1, 1]
        pin_server(proc.pid, engine, api)
        got = [os.sched_getaffinity(next(iter(level))) for level in levels]
        assert got == [api, engine, engine]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_command_speaks_vllm_bench_serve_options(tmp_path: Path) -> None:
    """--dataset-name prefix_repetition with vLLM's parameters: its prompts (prefix + suffix
    lengths, num_prefixes distinct prefixes), its output length, the result fields under
    vLLM's names; bad values exit 2 naming them."""
    out = tmp_path / "r.json"
    args = ["--dataset-name", "prefix_repetition", "--num-prompts", "12", "--vocab-size", "512"]
    args += ["--prefix-repetition-prefix-len", "32", "--prefix-repetition-suffix-len", "16"]
    args += ["--prefix-repetition-num-prefixes", "3", "--prefix-repetition-output-len", "4"]
    args += ["--request-rate", "50", "--burstiness", "0.5", "--percentile-metrics", "ttft,e2el"]
    args += ["--metric-percentiles", "50,99"]
    with FakeServer() as server:
        code, stdout, err = _replay(server.url, *args, "--json", str(out))
        assert code == 0, stdout + err
        prompts = [s["prompt"] for s in server.seen]
        assert len(prompts) == 12 and {len(p) for p in prompts} == {48}
        assert len({tuple(p[:32]) for p in prompts}) == 3 and max(max(p) for p in prompts) < 512
        assert {s["max_tokens"] for s in server.seen} == {4}
        row = json.loads(out.read_text())["rows"][0]
        assert (row["completed"], row["failed"], row["total_output_tokens"]) == (12, 0, 48)
        assert row["output_throughput"] == pytest.approx(48 / row["duration"], rel=1e-4)
        for key in ("request_throughput", "total_token_throughput", "mean_ttft_ms",
                    "median_e2el_ms", "p50_ttft_ms", "p99_e2el_ms", "std_ttft_ms"):  # fmt: skip
            assert key in row, key
        assert "mean_tpot_ms" not in row
        for bad, named in (("--dataset-name", "sharegtp"), ("--percentile-metrics", "ttfx")):
            code, _, err = _replay(server.url, *args, bad, named, "--json", str(out))
            assert code == 2 and repr(named) in err
        code, _, err = _replay(server.url, "--dataset-name", "random", "--json", str(out))
        assert code == 2 and "--vocab-size" in err


def test_command_aa_marks_noise(tmp_path: Path) -> None:
    """--aa: one server measured twice as A1 and A2; with repeats every B/A says whether it
    is within the runs' spread, and each row's spread is printed."""
    out = tmp_path / "r.json"
    with FakeServer(token_delay_s=0.001) as server:
        args = [server.url, "--aa", "--model", "tiny-llama", "-w", "no-sharing", "--limit", "4"]
        code, stdout, err = _replay(*args, "--repeats", "3", "--json", str(out))
        assert code == 0, stdout + err
        code2, _, err2 = _replay(server.url, server.url, "--aa", "-w", "no-sharing")
    record = json.loads(out.read_text())
    assert [r["policy"] for r in record["rows"]] == ["A1", "A2"]
    assert all(r["repeats"] == 3 and len(r["output_tok_s_runs"]) == 3 for r in record["rows"])
    noise = {e["metric"]: e["within_noise"] for e in record["ab"]}
    assert noise["output_tok_s"] in (True, False) and noise["ttft_p99_s"] in (True, False)
    assert "output tok/s spread over runs" in stdout and "noise" in stdout
    assert "within noise" in stdout or "outside noise" in stdout
    assert code2 == 2 and "one URL" in err2


def test_stream_is_read_as_vllms_client_reads_it() -> None:
    """Every chunk with a choice is a token event, an empty text (a special token's) too, the
    first the TTFT; the usage event is none, and its counts are the server's; the duration
    runs from the run's start, before the first send."""
    from feather_lab.replay.client import take_completion
    from feather_lab.replay.vllm_fields import vllm_fields

    times = iter([0.4, 0.5, 0.6])
    out = Outcome("r", prompt_tokens=3, want_tokens=2, scheduled_s=0.0, sent_s=0.1)
    for event in (
        {"choices": [{"index": 0, "text": ""}]},
        {"choices": [{"index": 0, "text": " t9"}]},
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
    ):
        take_completion(event, out, lambda: next(times))
    out.done_s = 0.7
    assert out.chunk_s == [0.4, 0.5] and (out.tokens, out.prompt_tokens) == (2, 4)
    fields = vllm_fields([out], ("ttft",), (50.0,))
    assert fields["mean_ttft_ms"] == pytest.approx(300.0)
    assert fields["duration"] == pytest.approx(0.7) and fields["total_input_tokens"] == 4
