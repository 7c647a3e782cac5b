"""What a live `vllm serve`'s scheduler saw and did, step by step (benchmarks/replay/README.md,
"paper-32g on the server, step by step"): the in-process bench's step log (`feather bench
--steps-out`), taken inside the server's engine core.

    python benchmarks/replay/replay_steps.py no-pressure --out DIR --runs \
        paper-32g,no-sharing,paper-32g
    python benchmarks/replay/replay_steps.py no-pressure --show DIR/server-steps.jsonl

Starts one server as benchmarks/replay/replay_ab.py does (the model in the engine core), Feather's
(`--server feather`) or vLLM's own (`--server vllm`), with a logging subclass as its
scheduler: `SteppedFeatherScheduler` wraps the policy in `bench.steplog.StepRecorder` and adds
to each step's line `arrived`, how many requests the engine core had received by then (vLLM's
`add_request`); `SteppedScheduler` writes the same fields for vLLM's scheduler. Then replays
the named workloads against it one after another, as `feather replay` does, and writes
`server-steps.jsonl` (every step of every run, `run` naming it) and `server-runs.json` (each
run's row, with the CPU per process and the machine's busy seconds). The same server serves
every run, so a later run meets the policy's state as the earlier ones left it, as in the A/B.
`replay_cpu.py --step-logs` uses the same schedulers (`stepped_spec`) in its A/B; `--show`
summarizes any of these logs and the in-process bench's (`summaries`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from feather_lab.bench.steplog import StepRecorder
from feather_sched.vllm.scheduler import FeatherScheduler

HERE = Path(__file__).resolve().parent
STEPS_ENV = "FEATHER_STEPS_OUT"


class SteppedFeatherScheduler(FeatherScheduler):
    """Feather's scheduler with its policy's steps logged to $FEATHER_STEPS_OUT, each line
    with the number of requests the engine core had received (`arrived`) and the run
    (`run`, from the file `<path>.run` the driver writes before each run)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrived = 0
        path = Path(os.environ[STEPS_ENV])
        out = path.open("a", buffering=1)
        self.feather.policy = _ArrivalRecorder(self, path, self.feather.policy, out)

    def add_request(self, request: Any) -> None:
        self.arrived += 1
        super().add_request(request)


class SteppedScheduler(Scheduler):
    """vLLM's own scheduler with each step logged as `SteppedFeatherScheduler` logs it (no
    decisions; prefix groups: distinct first KV blocks among the step's requests; prefill
    tokens: those of requests scheduled more than one token, as a decode is one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrived = 0
        path = Path(os.environ[STEPS_ENV])
        self._out = path.open("a", buffering=1)
        self._run_file = path.with_suffix(".run")
        self._started: dict[int, tuple[float, int]] = {}
        self._last_done = 0.0

    def add_request(self, request: Any) -> None:
        self.arrived += 1
        super().add_request(request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = super().schedule(*args, **kwargs)
        if out.total_num_scheduled_tokens > 0:
            self._started[id(out)] = (start, len(self.waiting))
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        result = super().update_from_output(scheduler_output, model_runner_output)
        step = self._started.pop(id(scheduler_output), None)
        if step is not None:
            done = time.perf_counter()
            tokens = scheduler_output.num_scheduled_tokens
            firsts = {_first_block(self.requests.get(rid)) for rid in tokens}
            line = {
                "run": self._run_file.read_text().strip() if self._run_file.exists() else "",
                "arrived": self.arrived,
                "duration_s": round(done - max(step[0], self._last_done), 6),
                "batch": len(tokens),
                "prefill_tokens": sum(n for n in tokens.values() if n > 1),
                "prefix_groups": len(firsts - {None}),
                "waiting": step[1],
                "decisions": [],
            }
            self._out.write(json.dumps(line, separators=(",", ":")) + "\n")
            self._last_done = done
        return result


def _first_block(req: Any) -> Any:
    hashes = getattr(req, "block_hashes", None)
    return hashes[0] if hashes else None


class _ArrivalRecorder(StepRecorder):
    def __init__(self, sched: SteppedFeatherScheduler, path: Path, inner: Any, out: Any) -> None:
        super().__init__(inner, _Tagged(self, out), {})
        self.sched = sched
        self.run_file = path.with_suffix(".run")

    def tags(self) -> dict[str, Any]:
        run = self.run_file.read_text().strip() if self.run_file.exists() else ""
        return {"run": run, "arrived": self.sched.arrived}


class _Tagged:
    """A file whose lines get the recorder's tags (run, arrived) merged in."""

    def __init__(self, recorder: _ArrivalRecorder, out: Any) -> None:
        self.recorder, self.out = recorder, out

    def write(self, line: str) -> None:
        row = json.loads(line)
        self.out.write(json.dumps({**self.recorder.tags(), **row}, separators=(",", ":")) + "\n")


def step_summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's steps: how many, their total time, what the first step saw, the STOPs,
    and the decode-only steps' time by (batch, running prefix groups)."""
    decode: dict[str, list[float]] = {}
    for line in lines:
        if line["prefill_tokens"] == 0:
            key = f"{line['batch']}/{line['prefix_groups']}"
            decode.setdefault(key, []).append(line["duration_s"])
    top = sorted(decode.items(), key=lambda kv: -len(kv[1]))[:3]
    return {
        "steps": len(lines),
        "step_s": round(sum(line["duration_s"] for line in lines), 2),
        "first_step_requests": lines[0]["batch"] + lines[0]["waiting"],
        "stops": sum(d["action"] == "STOP" for line in lines for d in line["decisions"]),
        "decode_median_s": {k: [len(v), round(statistics.median(v), 4)] for k, v in top},
    }


def summaries(paths: list[Path]) -> list[dict[str, Any]]:
    """Every run of the step logs named, summarized (`step_summary`), with its log's path
    and the run's name (the in-process bench's logs: workload and repeat)."""
    out = []
    for path in paths:
        runs: dict[str, list[dict[str, Any]]] = {}
        for text in path.read_text().splitlines():
            line = json.loads(text)
            run = line.get("run", f"{line.get('workload')}:{line.get('repeat')}")
            runs.setdefault(str(run), []).append(line)
        rows = path.with_name("server-runs.json")  # this script's runs, beside their log
        measured = {r["run"]: r for r in json.loads(rows.read_text())} if rows.exists() else {}
        for run, lines in runs.items():
            row = measured.get(run, {})
            client = {k: row[k] for k in RUN_FIELDS if k in row}
            log = f"{path.parent.name}/{path.name}"
            out.append({"log": log, "run": run, **client, **step_summary(lines)})
    return out


RUN_FIELDS = ("output_tok_s", "server_iterations", "server_cpu_s", "client_cpu_s", "machine_busy_s")
"""What `summaries` takes from a run's row (`server-runs.json`) beside its steps."""


def _parse(argv: list[str] | None, scenarios: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=scenarios)
    parser.add_argument("--show", nargs="+", type=Path, help="Summarize these step logs.")
    parser.add_argument("--record", type=Path, help="With --show: also write them as JSON.")
    parser.add_argument("--out", type=Path, help="Where the logs go (required to run).")
    parser.add_argument("--runs", default="paper-32g,no-sharing,paper-32g")
    parser.add_argument(
        "--stream-intervals", default="1", help="Run i streams every Nth token, N cycling."
    )
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "feather")
    parser.add_argument("--server", choices=("feather", "vllm"), default="feather")
    parser.add_argument(
        "--policy-options", default="{}", help="JSON added to Feather's FEATHER_POLICY_OPTIONS."
    )
    parser.add_argument(
        "--pin", action="store_true", help="Engine core on CPU 0, API server and client on CPU 1."
    )
    args = parser.parse_args(argv)
    if not args.show and args.out is None:
        parser.error("--out is required to run")
    return args


def _spec(args: argparse.Namespace, steps: Path) -> Any:
    """The server of replay_ab.py for `args.server`, its scheduler the logging subclass."""
    from replay_ab import server_specs

    feather = args.server == "feather"
    spec = server_specs(args.scenario, args.cache, model_in_core=True)[int(feather)]
    return stepped_spec(spec, steps, json.loads(args.policy_options))


def stepped_spec(spec: Any, steps: Path, policy_options: dict[str, Any] | None = None) -> Any:
    """`spec` (a `harness.vllm_server.ServerSpec`) with its scheduler's steps logged to
    `steps` (`SteppedFeatherScheduler` for Feather's, `SteppedScheduler` for vLLM's), the
    Feather policy's options updated with `policy_options`. Before each run, write the
    run's name to `steps.with_suffix(".run")`: each step's line carries it."""
    env = dict(spec.env)
    if spec.feather and policy_options:
        options = json.loads(env.get("FEATHER_POLICY_OPTIONS", "{}"))
        env["FEATHER_POLICY_OPTIONS"] = json.dumps({**options, **policy_options})
    env.update({STEPS_ENV: str(steps.resolve()), "PYTHONPATH": str(HERE)})
    cls = "SteppedFeatherScheduler" if spec.feather else "SteppedScheduler"
    return dataclasses.replace(spec, env=tuple(env.items()), scheduler_cls=f"replay_steps.{cls}")


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(HERE))
    from replay_ab import SCENARIOS

    from feather_lab.bench.suite import BenchSpec
    from feather_lab.harness.vllm_server import (
        machine_busy_s,
        pin_server,
        pin_threads,
        process_cpu_s,
        served,
    )
    from feather_lab.replay.client import ClientOptions, preflight
    from feather_lab.replay.runner import ReplaySpec, run_once
    from feather_lab.replay.workload import replay_workloads

    args = _parse(argv, sorted(SCENARIOS))
    if args.show:
        runs = summaries(args.show)
        for run in runs:
            print(json.dumps(run))
        if args.record is not None:
            from feather_lab.bench.record import write_record

            write_record(args.record, runs=runs)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    steps = (args.out / "server-steps.jsonl").resolve()
    steps.unlink(missing_ok=True)
    names, intervals = args.runs.split(","), [int(v) for v in args.stream_intervals.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, served([_spec(args, steps)], Path(tmp)) as servers:
        endpoint, pid = preflight(servers[0].url), servers[0].pid
        if args.pin:
            pin_server(pid, {0}, {1})
            pin_threads(os.getpid(), {1})
        bench = BenchSpec(workloads=tuple(dict.fromkeys(names)))
        work = {w.name: w for w in replay_workloads(bench, "kv-bound", None, 4096)}
        for i, name in enumerate(names):
            si = intervals[i % len(intervals)]
            tag = f"{i}:{name}:si{si}"
            steps.with_suffix(".run").write_text(tag)
            spec = ReplaySpec((args.server,), client=ClientOptions(stream_interval=si))
            t0, busy0, cpu0 = time.time(), machine_busy_s(), process_cpu_s(pid)
            row = run_once(endpoint, args.server, work[name], spec)
            cpu = {k: round(v - cpu0[k], 2) for k, v in process_cpu_s(pid).items()}
            busy = round(machine_busy_s() - busy0, 2)
            rows.append({**row, "run": tag, "started": t0, "ended": time.time()})
            rows[-1].update(server_cpu_s=cpu, machine_busy_s=busy)
            print(tag, row["output_tok_s"], "tok/s", cpu, "machine busy", busy, flush=True)
    from feather_lab.bench.record import write_record

    write_record(args.out / "server-runs.json", rows=rows)
    return 0


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    raise SystemExit(main())
