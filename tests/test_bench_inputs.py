"""Bad inputs to `feather bench` (and the result tools): each one a clean error before any
run: a non-zero exit (2 for a bad value), a message on stderr naming the value, no traceback,
and nothing simulated. Plus the guarantees around a finished run: the JSON is written first,
and a run that stops keeps its rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from feather_lab.cli import app
from feather_lab.workloads.traces import write_jsonl
from feather_sched import Request

runner = CliRunner()


def _unwritable_dir(tmp_path: Path) -> Path:
    """A folder nobody can create files in, root included (CI may run as root, and root
    ignores a folder's mode): /proc where there is one (Linux), else a read-only folder."""
    if Path("/proc").is_dir():
        return Path("/proc")
    ro_dir = tmp_path / "ro"
    ro_dir.mkdir()
    ro_dir.chmod(0o500)
    return ro_dir


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 1000, 64)
    good = tmp_path / "good.jsonl"
    write_jsonl(
        good, [Request(f"g{i}", np.r_[prefix, [i + 1] * 4], 4, i * 0.01) for i in range(12)]
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    absurd = tmp_path / "absurd.jsonl"
    write_jsonl(absurd, [Request("a", np.arange(8), 2, 0.0), Request("b", np.arange(8), 2, 1e9)])
    ancient = tmp_path / "ancient.jsonl"  # 1e12 s: no real trace, a unit error
    write_jsonl(ancient, [Request("a", np.arange(8), 2, 0.0), Request("b", np.arange(8), 2, 1e12)])
    huge_out = tmp_path / "huge-out.jsonl"  # over every model's context, a possible output
    write_jsonl(huge_out, [Request("h", np.arange(8), 10**6, 0.0)])
    absurd_out = tmp_path / "absurd-out.jsonl"  # over any context there is
    write_jsonl(absurd_out, [Request("h", np.arange(8), 10**12, 0.0)])
    big_prompt = tmp_path / "big-prompt.jsonl"
    write_jsonl(big_prompt, [Request("p", np.arange(5000) % 1000, 4, 0.0)])
    ro_dir = _unwritable_dir(tmp_path)
    no_hash = tmp_path / "no-hash.jsonl"  # Mooncake's lengths without its hash_ids
    no_hash.write_text('{"timestamp": 0, "input_length": 700, "output_length": 4}\n')
    bad_state = tmp_path / "state.json"
    bad_state.write_text("{not json")
    return {
        "good": good,
        "empty": empty,
        "absurd": absurd,
        "ancient": ancient,
        "huge_out": huge_out,
        "absurd_out": absurd_out,
        "big_prompt": big_prompt,
        "ro": ro_dir,
        "dir": tmp_path,
        "bad_state": bad_state,
        "no_hash": no_hash,
    }


# (args after `bench -w trace:GOOD --policies fcfs`, or full args when starting with "!"),
# the exit code, and text the message must hold.
BAD_BENCH = [
    (["--policies", ""], 2, "--policies"),
    (["--policies", " , "], 2, "--policies"),
    (["--policies", "fcfs,fcfs"], 2, "twice"),
    (["--policies", "fcfs,nope"], 2, "nope"),
    (["!", "-w", ""], 2, "--workload"),
    (["!", "-w", "nope-workload"], 2, "nope-workload"),
    (["!", "-w", "trace:"], 2, "trace:"),
    (["!", "-w", "trace:/nonexistent/t.jsonl"], 2, "not found"),
    (["!", "-w", "trace:{empty}"], 2, "no requests"),
    (["!", "-w", "trace:{absurd}"], 2, "span"),
    (["!", "-w", "trace:{ancient}"], 2, "1e+12 s is over 1e+10 s"),
    (["!", "-w", "trace:{absurd_out}"], 2, "over any model's context"),
    (["!", "-w", "trace:{absurd_out}", "--drop-overlong"], 2, "1,000,000,000,000 is over"),
    (["!", "-w", "trace:{huge_out}"], 2, "context"),
    (["!", "-w", "trace:{huge_out}", "--model", "tiny-llama"], 2, "context"),
    (["!", "-w", "trace:{big_prompt}", "--num-kv-blocks", "8"], 2, "--num-kv-blocks"),
    (["--num-kv-blocks", "1"], 2, "KV blocks"),
    (["--num-kv-blocks", "0"], 2, "num-kv-blocks"),
    (["--num-kv-blocks", "999999999999"], 2, "--num-kv-blocks"),
    (["--max-num-seqs", "0"], 2, "max-num-seqs"),
    (["--max-batched-tokens", "-5"], 2, "max-batched-tokens"),
    (["--max-batched-tokens", "1"], 2, "--max-batched-tokens 1"),
    (["--seed", "-1"], 2, "seed"),
    (["--hardware", "tpu9"], 2, "tpu9"),
    (["--hardware", "/nonexistent/hw.json"], 2, "hw.json"),
    (["--model", "gpt-17"], 2, "gpt-17"),
    (["--kernel", "warp"], 2, "warp"),
    (["--kernel", "flash"], 2, "valid: paged, ideal"),
    (["!", "-w", "nope-workload"], 2, "paper-100g"),  # the suite's names are listed too
    (["!", "-w", "trace:{dir}"], 2, "is a directory"),
    (["--json", "/proc/feather-nope.json"], 2, "cannot write"),  # writable for root by mode
    (["--engine", "gpu"], 2, "valid: sim, vllm, sglang"),
    (["--engine", "trt", "--limit", "20"], 2, "--engine 'trt': no such engine"),
    (["--engine", "sglang", "--json", "/proc/feather-nope.json"], 2, "cannot write"),
    (["!", "-w", "trace:{no_hash}"], 2, "needs hash_ids"),
    (["!", "-w", "shared-prefix", "--rate-scale", "3"], 2, "--rate-scale 3 changes nothing"),
    (["--arrival", "poisson:-3"], 2, "poisson"),
    (["--arrival", "poisson:abc"], 2, "poisson:abc"),
    (["--arrival", "sometimes"], 2, "sometimes"),
    (["--arrival", "poisson:5"], 2, "--arrival"),  # a trace keeps its timestamps
    (["!", "-w", "shared-prefix", "--arrival", "bursts:0:1"], 2, "bursts"),
    (["--rate-scale", "0"], 2, "--rate-scale"),
    (["--rate-scale", "-2"], 2, "--rate-scale"),
    (["--rate-scale", "nan"], 2, "--rate-scale"),
    (["--rate-scale", "inf"], 2, "--rate-scale"),
    (["--rate-scale", "fast"], 2, "rate-scale"),
    (["--limit", "0"], 2, "--limit"),
    (["--limit", "-4"], 2, "--limit"),
    (["--slo-ttft", "-1"], 2, "--slo-ttft"),
    (["--slo-tpot", "0"], 2, "--slo-tpot"),
    (["--slo-tpot", "nan"], 2, "--slo-tpot"),
    (["--json", "{dir}"], 2, "directory"),
    (["--json", "{ro}/x/out.json"], 2, "cannot write"),
    (["--json", "{good}/out.json"], 2, "not a directory"),
    (["--plot", "{good}/sub/p.png"], 2, "not a directory"),
    (["!", "-w", "trace:{huge_out}", "--drop-overlong"], 2, "no requests"),
    (["--plot", "{dir}"], 2, "directory"),
    (["--plot", "{dir}/plotfile"], 2, ".png"),
    (["--plot", "{dir}/plot.txt"], 2, ".png"),
    (["--plot", "{ro}/p.png"], 2, "cannot write"),
    (["--steps-out", "{ro}/s.jsonl"], 2, "cannot write"),
    (["--steps-out", "{dir}"], 2, "directory"),
    (["--policy-state", "{ro}/state.json", "--policies", "feather"], 2, "cannot write"),
    (["--policy-state", "{bad_state}", "--policies", "feather"], 2, "state.json"),
    (["--engine", "vllm", "--limit", "3"], 2, "simulator only"),
    (["--policies", "feather", "--feather-hardware", "bogus"], 2, "bogus"),
    (["--policies", "feather", "--feather-hardware", "/nope/hw.json"], 2, "hw.json"),
    (["--replicas", "2", "--feather-hardware", "bogus"], 2, "--feather-hardware bogus"),
    (["--engine", "vllm", "--feather-hardware", "bogus"], 2, "--feather-hardware bogus"),
    (["--hardware", "cpu"], 2, "no room for KV"),
    (["--rates", "0,5"], 2, "--rates"),
    (["--rates", "x"], 2, "--rates"),
    (["--rates", "5", "--rate-scale", "2"], 2, "--rates"),
    (["--scheduler-cpu", "fast"], 2, "--scheduler-cpu 'fast': no such mode; valid: model"),
    (["--scheduler-cpu", ""], 2, "valid: model, measured, off"),
    (["--engine", "vllm", "--scheduler-cpu", "off"], 2, "--scheduler-cpu: simulator only"),
]


def _expand(args: list[str], files: dict[str, Path]) -> list[str]:
    return [a.format(**{k: str(v) for k, v in files.items()}) for a in args]


@pytest.mark.parametrize("args, code, text", BAD_BENCH, ids=[" ".join(a[0]) for a in BAD_BENCH])
def test_bad_bench_input_is_a_clean_error(
    args: list[str], code: int, text: str, files: dict[str, Path], tmp_path: Path
) -> None:
    out, png = tmp_path / "o.json", tmp_path / "o.png"
    defaults = ["--json", str(out), "--plot", str(png)]
    if args and args[0] == "!":
        full = ["bench", "--policies", "fcfs", *defaults, *_expand(args[1:], files)]
    else:
        base = ["bench", "-w", f"trace:{files['good']}", "--policies", "fcfs", *defaults]
        full = [*base, *_expand(args, files)]
    result = runner.invoke(app, full, terminal_width=80)
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert text.lower() in result.stderr.lower(), result.stderr
    assert not out.exists()  # nothing ran, nothing written


def test_json_is_written_before_a_failing_plot(files: dict[str, Path], tmp_path: Path, monkeypatch):
    from feather_lab.bench import report

    def broken(*_a, **_k):
        raise RuntimeError("no display")

    monkeypatch.setattr(report, "plot_results", broken)
    out = tmp_path / "o.json"
    args = ["bench", "-w", f"trace:{files['good']}", "--policies", "fcfs", "--json", str(out)]
    result = runner.invoke(app, [*args, "--plot", str(tmp_path / "o.png")])
    assert result.exit_code == 1
    assert "no display" in result.stderr and str(out) in result.stderr
    assert json.loads(out.read_text())["rows"][0]["requests"] == 12


def test_an_interrupted_bench_keeps_its_finished_rows(
    files: dict[str, Path], tmp_path: Path, monkeypatch
) -> None:
    from feather_lab.bench import suite

    real = suite.simulate
    calls = []

    def interrupt_fourth(*a, **k):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(suite, "simulate", interrupt_fourth)
    out = tmp_path / "o.json"
    trace = f"trace:{files['good']}"
    args = ["bench", "-w", f"{trace},no-sharing", "--limit", "50", "--policies", "fcfs,lpm"]
    args += ["--json", str(out)]
    result = runner.invoke(app, [*args, "--plot", str(tmp_path / "o.png")])
    assert result.exit_code == 130
    payload = json.loads(out.read_text())
    assert payload["config"]["interrupted"] is True
    # both runs of the first workload, and the second's finished fcfs run
    got = [(r["workload"], r["policy"]) for r in payload["rows"]]
    assert got == [(trace, "fcfs"), (trace, "lpm"), ("no-sharing", "fcfs")]
    assert payload["rows"][1]["vs_fcfs"] is not None


@pytest.mark.parametrize(
    "args",
    [
        ["index-bench", "--queues", "10", "--json"],
        ["calibrate", "--json"],
        ["calibrate", "--out"],
        ["probe", "--device", "cpu", "--json"],
        ["probe", "--device", "cpu", "--plot"],
        ["train", "--out"],
    ],
)
def test_every_command_refuses_an_unwritable_output_before_any_work(
    args: list[str], tmp_path: Path
) -> None:
    """The same check as `feather bench --json`, before the engine, the probe or training
    starts (each would otherwise run for minutes and lose its result at the save)."""
    target = str(_unwritable_dir(tmp_path) / "feather-nope.json")
    result = runner.invoke(app, [*args, target])
    assert result.exit_code == 2, result.output
    assert "cannot write" in result.output and args[-1] in result.output
    assert "Traceback" not in result.output
