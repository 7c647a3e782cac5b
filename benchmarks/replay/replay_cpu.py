"""The replay A/B interleaved with the in-process bench, with each process's CPU time
(benchmarks/replay/README.md): do the live servers lose Feather's gain to the work around the
engine (the API server detokenizing and streaming every token, the client parsing it)?

    python benchmarks/replay/replay_cpu.py kv-pressure --json OUT.json

Starts the two servers of benchmarks/replay/replay_ab.py (vLLM's scheduler, Feather's) for one KV
scenario and, per repeat: the replay of every workload against both servers once per
stream interval (`--stream-intervals 1,8`: a chunk per token, then one per 8 tokens), the
servers' order and the intervals' order alternating between repeats; then one in-process
bench run of the same requests on the same engine settings (`feather bench --engine vllm`,
both schedulers) while the servers sit idle. Every replay run's row adds the CPU seconds
its server's API process (`api_cpu_s`) and engine core (`engine_cpu_s`) used during it, the
client's (`client_cpu_s`) and the run's wall time (`run_wall_s`); the in-process rows carry
the bench's own `cpu_s` (one process does everything there).

Writes, after every repeat (a cut-short session keeps the finished repeats): the replay
record of each stream interval (`--json` for 1, `<stem>-si<N>.json` for the others; the
format `feather replay` writes) and `<stem>-inprocess.json` (the bench rows, medians over
the repeats with every run's throughput). Needs the `vllm` and `replay` extras; Linux
(/proc).
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from replay_ab import MODEL_IN_CORE_HELP, PRIOR, SCENARIOS, server_specs

from feather_lab.bench.machine import config_provenance
from feather_lab.bench.record import write_record
from feather_lab.bench.suite import BenchSpec
from feather_lab.harness.vllm_server import Served, machine_busy_s, process_cpu_s, served
from feather_lab.replay.client import ClientOptions, preflight
from feather_lab.replay.report import replay_config
from feather_lab.replay.runner import ReplaySpec, run_once, summarize
from feather_lab.replay.summary import median_row
from feather_lab.replay.workload import replay_workloads

LABELS = ("vllm", "feather")


def _cpu(servers: list[Served]) -> list[dict[str, float]]:
    return [process_cpu_s(s.pid) for s in servers]


def _measured_run(
    servers, endpoints, i: int, work, spec: ReplaySpec, steps: Path | None
) -> dict[str, Any]:
    """One replay run against server `i`, with the CPU each process spent during it; with
    `steps` (--step-logs), the run's name goes on each of its steps' lines there."""
    if steps is not None:
        run = f"{work.name}:si{spec.client.stream_interval}:{time.time():.0f}"
        (steps / f"{LABELS[i]}-steps.run").write_text(run)
    before, busy0, t0 = _cpu(servers), machine_busy_s(), time.perf_counter()
    row = run_once(endpoints[i], LABELS[i], work, spec)
    after, busy, wall = _cpu(servers), machine_busy_s() - busy0, time.perf_counter() - t0
    other = 1 - i
    ours = sum(sum(a.values()) - sum(b.values()) for a, b in zip(after, before))
    return {
        **row,
        "stream_interval": spec.client.stream_interval,
        "run_wall_s": round(wall, 3),
        "api_cpu_s": round(after[i]["api"] - before[i]["api"], 2),
        "engine_cpu_s": round(after[i]["engine"] - before[i]["engine"], 2),
        "worker_cpu_s": round(after[i]["worker"] - before[i]["worker"], 2),
        "idle_server_cpu_s": round(sum(after[other].values()) - sum(before[other].values()), 2),
        "others_cpu_s": round(busy - ours - row["client_cpu_s"], 2),
    }


def _inprocess(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """One in-process bench run (both schedulers) of the in-process workloads: its rows."""
    cmd = [sys.executable, "-m", "feather_lab.cli", "bench", "--engine", "vllm"]
    cmd += ["--model", "kv-bound", "-w", args.inprocess_workloads, "--policies", "feather"]
    cmd += ["--num-kv-blocks", str(SCENARIOS[args.scenario]), "--repeats", "1"]
    cmd += ["--max-batched-tokens", "8192", "--feather-hardware", str(PRIOR), "--json", str(out)]
    cmd += ["--plot", str(out.with_suffix(".png"))]  # not the bench's default, in the cwd
    if args.step_logs is not None:
        cmd += ["--steps-out", str(args.step_logs / f"{out.stem}-steps.jsonl")]
    busy0, t0, own0 = machine_busy_s(), time.perf_counter(), _children_cpu_s()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall, own = time.perf_counter() - t0, _children_cpu_s() - own0
    rows = [_named(row, args.scenario) for row in json.loads(out.read_text())["rows"]]
    for row in rows:
        row.update(session_wall_s=round(wall, 2), session_cpu_s=round(own, 2))
        row["others_cpu_s"] = round(machine_busy_s() - busy0 - own, 2)
    return rows


def _named(row: dict[str, Any], scenario: str) -> dict[str, Any]:
    """The bench names a `--num-kv-blocks` run `paper-32g (kv-1024-blocks)`; the replay's
    row is `paper-32g (kv-pressure)`: the same name, so `feather compare` pairs them."""
    base = row["workload"].split(" (", 1)[0]
    return {**row, "workload": f"{base} ({scenario})", "bench_workload": row["workload"]}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _inprocess_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians per (workload, policy) over the repeats, each run's throughput and B/A kept."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        grouped.setdefault((r["workload"], r["policy"]), []).append(r)
    rows = []
    for group in grouped.values():
        row = median_row(group)
        row["vs_fcfs_runs"] = [r.get("vs_fcfs") for r in group]
        rows.append(row)
    return rows


def _write(args, endpoints, intervals, runs, inprocess_runs) -> None:
    """Every record, from the runs so far."""
    for si in intervals:
        mine = [r for r in runs if r["stream_interval"] == si]
        if not mine:
            continue
        rows, ab = summarize(mine, LABELS)
        opts = {
            "model": "kv-bound",
            "workload": [args.workloads],
            "repeats": max(r["repeat"] for r in mine) + 1,
            "scenario": args.scenario,
            "reset_prefix_cache": True,
            "stream_interval": si,
        }
        config = {**config_provenance(), **replay_config(opts, LABELS, endpoints)}
        config["interleaved_with"] = args.json.with_stem(args.json.stem + "-inprocess").name
        config["model_in_core"] = args.model_in_core
        for server in config["servers"]:  # no machine paths in a record
            server["served_model"] = home_relative(server["served_model"])
        path = args.json if si == 1 else args.json.with_stem(f"{args.json.stem}-si{si}")
        write_record(path, config=config, rows=rows, ab=ab, runs=mine, interrupted=False)
    if inprocess_runs:
        path = args.json.with_stem(args.json.stem + "-inprocess")
        config = {**config_provenance(), "engine": "vllm", "model": "kv-bound"}
        config.update(scenario=args.scenario, num_kv_blocks=SCENARIOS[args.scenario])
        rows = _inprocess_rows(inprocess_runs)
        write_record(path, config=config, rows=rows, runs=inprocess_runs)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", default="paper-32g,no-sharing")
    parser.add_argument(
        "--inprocess-workloads", default="paper-32g", help="'' for none (with --limit)."
    )
    parser.add_argument("--stream-intervals", default="1,8")
    parser.add_argument(
        "--limit", type=int, default=None, help="Requests per workload (a smoke run)."
    )
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "feather")
    parser.add_argument("--model-in-core", action="store_true", help=MODEL_IN_CORE_HELP)
    parser.add_argument(
        "--step-logs",
        type=Path,
        default=None,
        help="Log every step of every run here (benchmarks/replay/replay_steps.py's schedulers in "
        "the servers, --steps-out in process): <label>-steps.jsonl, inprocess-*-steps.jsonl.",
    )
    parser.add_argument(
        "--lock",
        type=Path,
        default=None,
        help="A file to flock while the servers start and during each repeat (not between).",
    )
    parser.add_argument(
        "--show", action="store_true", help="Print the records' table; run nothing."
    )
    return parser.parse_args(argv)


@contextmanager
def _held(lock: Path | None) -> Iterator[None]:
    """The machine's shared benchmark lock for one stretch of work, so other engineers'
    runs can go between the repeats (the servers sit idle meanwhile)."""
    if lock is None:
        yield
        return
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def home_relative(path: str) -> str:
    """`path` with the home directory written as `~` (the served model's directory)."""
    home = str(Path.home())
    return "~" + path[len(home) :] if path.startswith(home + "/") else path


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.show:
        print(cpu_table(args.json))
        return 0
    intervals = [int(v) for v in args.stream_intervals.split(",")]
    specs = server_specs(args.scenario, args.cache, args.model_in_core)
    if args.step_logs is not None:
        from replay_steps import stepped_spec  # imports vLLM (its schedulers subclass vLLM's)

        args.step_logs.mkdir(parents=True, exist_ok=True)
        logs = [args.step_logs / f"{label}-steps.jsonl" for label in LABELS]
        specs = [stepped_spec(spec, log) for spec, log in zip(specs, logs)]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        with _held(args.lock):
            servers = stack.enter_context(served(specs, Path(tmp)))
        endpoints = [preflight(s.url) for s in servers]
        bench = BenchSpec(workloads=tuple(args.workloads.split(",")), limit=args.limit)
        context = min(e.max_model_len or 0 for e in endpoints)
        workloads = [
            dataclasses.replace(w, name=f"{w.name} ({args.scenario})")
            for w in replay_workloads(bench, "kv-bound", None, context)
        ]
        runs: list[dict[str, Any]] = []
        inprocess_runs: list[dict[str, Any]] = []
        for rep in range(args.repeats):
            with _held(args.lock):
                runs += _replay_repeat(
                    servers, endpoints, workloads, intervals, rep, args.step_logs
                )
                _write(args, endpoints, intervals, runs, inprocess_runs)
                if args.inprocess_workloads:
                    inprocess_runs += _inprocess_repeat(args, servers, Path(tmp), rep)
                    _write(args, endpoints, intervals, runs, inprocess_runs)
    print(cpu_table(args.json))
    return 0


def _replay_repeat(
    servers, endpoints, workloads, intervals, rep: int, steps: Path | None = None
) -> list[dict[str, Any]]:
    """Repeat `rep`'s replay runs: every workload against both servers at every stream
    interval, the servers' and the intervals' order alternating between repeats."""
    order = [0, 1] if rep % 2 == 0 else [1, 0]
    runs = []
    for si in intervals if rep % 2 == 0 else intervals[::-1]:
        spec = ReplaySpec(LABELS, client=ClientOptions(stream_interval=si))
        for work in workloads:
            for i in order:
                row = _measured_run(servers, endpoints, i, work, spec, steps)
                runs.append({**row, "repeat": rep})
                print(_line(row), flush=True)
    return runs


def _inprocess_repeat(args, servers, tmp: Path, rep: int) -> list[dict[str, Any]]:
    """Repeat `rep`'s in-process bench run, with what the idle servers used meanwhile."""
    before = _cpu(servers)
    rows = _inprocess(args, tmp / f"inprocess-{rep}.json")
    idle = sum(sum(a.values()) - sum(b.values()) for a, b in zip(_cpu(servers), before))
    for row in rows:
        row.update(repeat=rep, idle_servers_cpu_s=round(idle, 2))
        print(_inprocess_line(row), flush=True)
    return rows


def cpu_table(path: Path) -> str:
    """The records' story, as benchmarks/replay/README.md tells it: per (stream interval or
    in-process, workload, server), the median throughput with every run's, the B/A of each
    repeat's pair, and the median CPU seconds per process over the run's wall time."""
    stem, lines = path.stem, []
    paths = [*sorted(path.parent.glob(f"{stem}-si*.json")), path]
    runs = [r for p in paths if p.exists() for r in json.loads(p.read_text())["runs"]]
    inproc = path.with_stem(stem + "-inprocess")
    if inproc.exists():
        runs += [
            {**r, "stream_interval": "in-process"} for r in json.loads(inproc.read_text())["runs"]
        ]
    groups: dict[tuple, dict[str, dict[int, dict]]] = {}
    for r in runs:
        key = (str(r["stream_interval"]), r["workload"])
        groups.setdefault(key, {}).setdefault(r["policy"], {})[r["repeat"]] = r
    for (si, work), by in sorted(groups.items()):
        pairs = [by["feather"][k]["output_tok_s"] / by["vllm"][k]["output_tok_s"]
                 for k in by.get("vllm", {}) if k in by.get("feather", {})]  # fmt: skip
        ratio = ", ".join(f"{x:.2f}" for x in sorted(pairs))
        lines.append(f"{si:>10} {work}: B/A per repeat {ratio}")
        for label, reps in by.items():
            lines.append(f"{'':>12}{label:<8} " + _cpu_cells(list(reps.values())))
    return "\n".join(lines)


def _cpu_cells(runs: list[dict[str, Any]]) -> str:
    def med(key: str) -> float:
        return statistics.median(r.get(key) or 0.0 for r in runs)

    tput = ", ".join(f"{r['output_tok_s']:.0f}" for r in runs)
    if "engine_cpu_s" not in runs[0]:  # in process: one process does all
        return (f"{med('output_tok_s'):.0f} tok/s ({tput}); cpu {med('cpu_s'):.0f} s over "
                f"{med('makespan_s'):.0f} s; others {med('others_cpu_s'):.0f} s over the "
                f"session's {med('session_wall_s'):.0f} s")  # fmt: skip
    return (f"{med('output_tok_s'):.0f} tok/s ({tput}); over {med('run_wall_s'):.0f} s: engine "
            f"{med('engine_cpu_s'):.0f} s, worker {med('worker_cpu_s'):.0f} s, api "
            f"{med('api_cpu_s'):.1f} s, client {med('client_cpu_s'):.1f} s, idle server "
            f"{med('idle_server_cpu_s'):.1f} s, "
            f"others {med('others_cpu_s'):.1f} s")  # fmt: skip


def _inprocess_line(row: dict[str, Any]) -> str:
    return (
        f"in-process {row['workload']} {row['policy']}: {row['output_tok_s']} tok/s, cpu "
        f"{row['cpu_s']:.1f} s over {row['makespan_s']:.1f} s; others "
        f"{row['others_cpu_s']} s over the session's {row['session_wall_s']} s"
    )


def _line(row: dict[str, Any]) -> str:
    return (
        f"replay si={row['stream_interval']} {row['workload']} {row['policy']}: "
        f"{row['finished']}/{row['requests']} ok, {row['output_tok_s']} tok/s, cpu engine "
        f"{row['engine_cpu_s']} worker {row['worker_cpu_s']} api {row['api_cpu_s']} "
        f"client {row['client_cpu_s']} "
        f"over {row['run_wall_s']} s; {row.get('server_iterations')} iterations"
    )


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    raise SystemExit(main())
