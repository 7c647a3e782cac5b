"""Feather inside SGLang's real scheduler loop (sglang 0.5.x on CPU, extra 'sglang').

Each scheduler here is `sglang.srt.managers.scheduler.Scheduler` itself, built in its own
process the way `run_scheduler_process` builds it: SGLang's plugin loader first (the plugin is
on because `SGLANG_PLUGINS=feather` names it, as on a server), then the real TpModelWorker,
ModelRunner, KV pools, radix cache, chunked prefill and retraction, then its own event loop.
Requests, aborts and cache flushes go in over its ZMQ input socket as SGLang's own request
objects (harness/sglang_engine.py).

The one part that is not SGLang's: the model's forward is a stand-in
(`FeatherStandInForCausalLM`, registered in SGLang's ModelRegistry and loaded with
`--load-format dummy` from a config written at test time): it returns logits selecting a
deterministic next token that is never EOS. So every request that is not aborted must finish
with exactly `max_new_tokens` tokens whatever order the scheduler picked.

Building a scheduler process costs tens of seconds of imports, so each configuration is served
once (module-scoped) and the tests below read its report.
"""

from __future__ import annotations

import json
import os
import random

import pytest

pytestmark = pytest.mark.sglang

PREFIX = 96


def _require_sglang() -> None:
    from feather_sched.sglang.cpu import prepare_cpu_import

    prepare_cpu_import()
    if os.environ.get("FEATHER_REQUIRE_SGLANG") == "1":
        import sglang.srt.managers.scheduler  # noqa: F401
    else:
        pytest.importorskip(
            "sglang.srt.managers.scheduler",
            reason="SGLang is not installed (see the 'sglang' extra in pyproject.toml)",
        )


def workload(tag: str = "", seed: int = 0):
    """Prefix groups arriving interleaved (two waves), long-output requests that outgrow the
    KV pool (SGLang must retract), a prompt longer than the prefill chunk, and two aborts:
    one while waiting, one while decoding. Rids are fixed-width: SGLang aborts by prefix."""
    from feather_lab.harness.sglang_spec import ServeRequest

    rng = random.Random(seed)
    prefixes = {g: [rng.randrange(4, 500) for _ in range(PREFIX)] for g in "ABCD"}
    reqs = []
    for i in range(24):
        g = "ABCD"[i % 4]
        tail = [rng.randrange(4, 500) for _ in range(16)]
        abort = 0 if i == 6 else (3 if i == 13 else None)
        reqs.append(
            ServeRequest(
                rid=f"{tag}{g}{i:03d}",
                prompt=prefixes[g] + tail,
                output_len=8 + (i * 5) % 29,
                arrival_s=0.0 if i < 12 else 0.3,
                group=g,
                abort_after_tokens=abort,
            )
        )
    for i in range(8):  # unique prompts, long outputs: decode outgrows the pool
        # Any 3 of them running at once outgrow it (3 x 532 tokens > 1,400) whatever the
        # timing: SGLang admits each reserving a fifth of its output (below) and retracts
        # when they grow past that. At 300 tokens 5 had to overlap, and in some runs SGLang's
        # reservations let only 4 run at once, staggered: no retraction in either run.
        prompt = [rng.randrange(4, 500) for _ in range(32)]
        reqs.append(ServeRequest(f"{tag}L{i:03d}", prompt, 500, arrival_s=0.1))
    long_prompt = [rng.randrange(4, 500) for _ in range(600)]
    reqs.append(ServeRequest(f"{tag}P000", long_prompt, 6, arrival_s=0.2))
    return reqs


def loop_spec(policy: str | None, **kw):
    from feather_lab.harness.sglang_spec import ServeSpec

    return ServeSpec(
        runs=[workload("a", 0), workload("b", 1)],
        feather_policy=policy,
        max_total_tokens=1400,
        max_running_requests=12,
        chunked_prefill_size=256,
        max_prefill_tokens=1024,
        chunk_tokens=32,
        extra_policies={"raising": "feather_lab.harness.sglang_engine:RaisingPolicy"},
        # SGLang's own admission optimism (default 0.7 of max_new_tokens reserved): lower, it
        # admits more long-output requests than their decode will fit, so it must retract.
        env={"SGLANG_INIT_NEW_TOKEN_RATIO": "0.2"},
        **kw,
    )


POLICIES = {
    "off": None,
    "grouped": "grouped",
    "feather": "feather",
    "raising": "raising",
    "grouped-overlap": "grouped",
}
"""Configuration -> FEATHER_POLICY. `grouped-overlap` runs SGLang's overlap event loop (the
GPU default: the next batch is picked while the previous one runs) instead of the normal one."""

_reports: dict[str, dict] = {}


@pytest.fixture(scope="module")
def state_path(tmp_path_factory):
    return tmp_path_factory.mktemp("sglang-loop") / "feather-state.json"


@pytest.fixture(scope="module")
def served(state_path):
    """name -> the report of one scheduler process serving `loop_spec` (built on demand)."""
    _require_sglang()
    from feather_lab.harness.sglang_engine import serve

    def get(name: str) -> dict:
        if name not in _reports:
            extra: dict = {"overlap": True} if name.endswith("-overlap") else {}
            if name == "feather":
                extra = {"policy_state": str(state_path), "state_every_s": 0.5}
            if name == "off":  # its forward sleeps the H200 profile's step: the clock's test
                extra = {"step_cost": ("h200", "llama-3.1-8b")}
            _reports[name] = serve(loop_spec(POLICIES[name], **extra))
        return _reports[name]

    return get


def check_every_request_finished_once(report: dict) -> None:
    assert report["scheduler_class"] == "sglang.srt.managers.scheduler.Scheduler"
    assert report["exitcode"] == 0
    for run, reqs in zip(report["runs"], (workload("a", 0), workload("b", 1)), strict=True):
        got = run["requests"]
        assert set(got) == {r.rid for r in reqs}
        for r in reqs:
            out = got[r.rid]
            assert out["finish_messages"] == 1, (r.rid, out)
            if r.abort_after_tokens is None:
                assert out["reason"]["type"] == "length", (r.rid, out)
                assert out["tokens"] == r.output_len, (r.rid, out)
            else:
                assert out["reason"]["type"] == "abort", (r.rid, out)
                assert out["tokens"] < r.output_len
        # the abort sent right behind its request usually finds it waiting (0 tokens), but
        # may arrive in a later poll of the socket, after SGLang admitted it: both are fine


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_request_finishes_once_with_its_length(served, name):
    report = served(name)
    check_every_request_finished_once(report)
    assert report["plugin_hooked"] is (name != "off")
    loop = report["loop"]
    assert loop["retractions"] > 0, "the workload must push SGLang into retraction"
    assert all(n >= 1 for n in loop["admitted"].values())
    long_prompt_steps = loop["extend_steps"]
    assert long_prompt_steps > 0


@pytest.mark.parametrize("name", ["grouped", "feather", "raising", "grouped-overlap"])
def test_feather_ran_inside_the_loop_and_cht_is_empty(served, name):
    report = served(name)
    assert report["event_loop"] == ("overlap" if name.endswith("-overlap") else "normal")
    feather = report["feather"]
    assert feather is not None and feather["policy"] == POLICIES[name]
    stats = feather["stats"]
    assert feather["passes"] > 0
    # one step-time feedback per batch SGLang ran, each before the next iteration admits
    assert stats["feedback_steps"] == report["loop"]["steps"]
    assert stats["hashed"] > 0
    assert feather["cht_empty"], (feather["cht_waiting"], feather["cht_running"])


def test_off_leaves_sglang_alone(served):
    assert served("off")["feather"] is None


def test_stand_in_step_takes_its_priced_time_and_cpu_is_split(served):
    """Pricing a batch is inside its step: the stand-in sleeps the rest, so the two together
    take at least the profile's time; and the loop thread's CPU clock holds the disjoint parts
    the counters split off it (the stand-in's, the pricing's, batch picking)."""
    for run in served("off")["runs"]:
        loop = run["loop"]
        assert loop["priced_s"] > 0 and loop["pricing_s"] > 0
        assert loop["stand_in_s"] + loop["pricing_s"] >= 0.99 * loop["priced_s"]
        parts = loop["stand_in_cpu_s"] + loop["pricing_cpu_s"] + loop["pick_cpu_s"]
        assert 0 < parts <= loop["loop_cpu_s"]
    unpriced = served("grouped")["runs"][0]["loop"]
    assert unpriced["priced_s"] == 0 and unpriced["pricing_s"] == 0


def test_raising_policy_lets_sglang_carry_on(served):
    stats = served("raising")["feather"]["stats"]
    assert stats["policy_errors"] > 0 and "policy bug" in stats["last_error"]


def test_grouped_order_reaches_sglang_batches(served):
    """SGLang's own `for req in waiting_queue` loop offered exactly the candidate Feather put
    next, every pass (no hand-over to SGLang's order), and its adder admitted them. (Whether
    the order pays is the bench's question: benchmarks/sglang/loop.md.)"""
    stats = served("grouped")["feather"]["stats"]
    assert stats["policy_steps"] > 0 and stats["admitted"] > 0
    assert stats["handovers"] == 0 and stats["policy_errors"] == 0


def test_bandit_state_is_saved_and_reloaded(served, state_path):
    from feather_lab.harness.sglang_engine import serve
    from feather_lab.harness.sglang_spec import ServeSpec

    first = served("feather")["feather"]
    assert first["counters"].get("decisions", 0) > 0 or first["stats"]["decisions"] > 0
    assert state_path.is_file(), "saved while serving and at exit"
    saved = json.loads(state_path.read_text())
    assert saved["policy"] == "feather"
    again = serve(
        ServeSpec(
            runs=[workload("c", 2)[:8]],
            feather_policy="feather",
            policy_state=str(state_path),
            max_total_tokens=4096,
        )
    )
    assert again["feather"]["loaded_table"] == saved["table"]
    assert again["feather"]["loaded_table"], "a non-empty table came back"


def test_feather_bench_engine_sglang(tmp_path):
    """`feather bench --engine sglang` prints the table and writes JSON rows like --engine
    vllm's: SGLang's own fcfs (the baseline) beside a Feather policy, on the real loop."""
    _require_sglang()
    from typer.testing import CliRunner

    from feather_lab.cli import app

    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    args = ["bench", "--engine", "sglang", "--policies", "fcfs,grouped", "--repeats", "1"]
    args += ["--workload", "shared-prefix", "--num-kv-blocks", "96"]
    result = CliRunner().invoke(app, [*args, "--json", str(out), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "feather bench --engine sglang" in result.output
    record = json.loads(out.read_text())
    assert record["config"]["engine"] == "sglang" and record["config"]["note"]
    # the calibrated profile is named from the checkout, never by this machine's path
    assert record["config"]["step_cost"]["hardware"] == "benchmarks/vllm/cpu-vllm-fitted.json"
    rows = {r["policy"]: r for r in record["rows"]}
    assert set(rows) == {"fcfs", "grouped"}
    for r in rows.values():
        assert r["requests"] == 128 and r["output_tokens"] == 128 * 64
        assert r["output_tok_s"] > 0 and r["steps"] > 0
        assert r["workload"] == "shared-prefix (kv-96-blocks)"
    assert rows["fcfs"]["vs_fcfs"] == 1.0
    assert rows["fcfs"]["feather_plugin"] is False and rows["grouped"]["feather_plugin"] is True
    assert rows["grouped"]["policy_errors"] == 0
