"""Does a server's previous run slow its next one, and more on Feather's
(benchmarks/replay/README.md,
"no-sharing after paper-32g")? The replay A/B's no-sharing runs under KV pressure each followed
a paper-32g run on the same server, and came out at 0.94x; fresh servers had given 0.97x.

    python benchmarks/replay/nosharing_ab.py kv-pressure --repeats 3 --out DIR \
        --json OUT.json --lock LOCKFILE

Per repeat, a fresh pair of the A/B's servers (benchmarks/replay/replay_ab.py, the model in the
engine core; their schedulers `core_state.py`'s logging subclasses), and on each server, the
two servers interleaved (their order alternating between repeats): no-sharing (`cold`, the
server's first run), paper-32g, no-sharing again (`after`). Every run is `feather replay`'s
runner (stream interval 1, prefix cache emptied first) with the CPU per process and the
machine's busy seconds around it, as `replay_cpu.py` measures; after it, while the server
sits idle, the engine core's snapshot (`core_state.py`: steps, step times, GC passes and
time, unfrozen objects, Feather's structure sizes). With `--lock`, each repeat (its servers'
start, its six runs and their snapshots, the servers' stop) holds the lock: other work goes
between repeats, never between one server's runs. The record is written after every run;
`--show` prints its table and each run's engine-core account.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LABELS = ("vllm", "feather")
PHASES = (("cold", "no-sharing"), ("paper", "paper-32g"), ("after", "no-sharing"))
"""The default phases: (name, workload) in the order each server runs them."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=("kv-pressure", "no-pressure"))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--out", type=Path, help="The engine cores' logs (required to run).")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lock", type=Path, default=None)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "feather")
    parser.add_argument(
        "--no-repeat-after",
        type=float,
        default=None,
        help="A Unix time after which no new repeat starts (the record keeps those done).",
    )
    parser.add_argument("--limit", type=int, default=None, help="Requests per workload (smoke).")
    parser.add_argument("--show", action="store_true", help="Print the record's table.")
    parser.add_argument(
        "--phases",
        type=_phases,
        default=PHASES,
        help="NAME:WORKLOAD,... in order (default cold:no-sharing,paper:paper-32g,"
        "after:no-sharing); the first no-sharing phase, if any, is the cold one every "
        "later one is compared with.",
    )
    parser.add_argument(
        "--feather-options",
        type=json.loads,
        default={},
        help="JSON object merged into the Feather server's FEATHER_POLICY_OPTIONS "
        "(e.g. '{\"stop_delay_share\": 0.2}').",
    )
    args = parser.parse_args(argv)
    if not args.show and args.out is None:
        parser.error("--out is required to run")
    if not isinstance(args.feather_options, dict):
        parser.error(f"--feather-options must be a JSON object, got {args.feather_options!r}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def _phases(text: str) -> tuple[tuple[str, str], ...]:
    pairs = [tuple(p.split(":", 1)) for p in text.split(",")]
    bad = [p for p in pairs if len(p) != 2 or p[1] not in ("no-sharing", "paper-32g")]
    names = [p[0] for p in pairs]
    if bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected distinct NAME:WORKLOAD pairs, WORKLOAD no-sharing or paper-32g"
        )
    return tuple(pairs)  # type: ignore[arg-type]


def _with_options(spec: Any, options: dict[str, Any]) -> Any:
    """`spec` with `options` merged into its FEATHER_POLICY_OPTIONS (a Feather server's)."""
    env = dict(spec.env)
    if not options or "FEATHER_POLICY_OPTIONS" not in env:
        return spec
    merged = {**json.loads(env["FEATHER_POLICY_OPTIONS"]), **options}
    env["FEATHER_POLICY_OPTIONS"] = json.dumps(merged)
    return dataclasses.replace(spec, env=tuple(env.items()))


def _run(args: argparse.Namespace, rep: int, servers, endpoints, logs, work, record) -> None:
    """Repeat `rep` on a fresh pair: every phase on both servers, each run then its snapshot."""
    from core_state import request_snapshot
    from replay_cpu import _measured_run

    from feather_lab.replay.runner import ReplaySpec

    order = [0, 1] if rep % 2 == 0 else [1, 0]
    spec = ReplaySpec(LABELS)
    for phase, name in args.phases:
        for i in order:
            started = time.time()
            row = _measured_run(servers, endpoints, i, work[name], spec, None)
            snap = request_snapshot(logs[i], f"{rep}:{phase}")
            row.update(repeat=rep, phase=phase, started=round(started, 1))
            if name == "paper-32g":  # 400-1,800 steps: their count, sum and median are kept
                snap = {k: v for k, v in snap.items() if k not in ("step_durations", "step_shapes")}
            record["runs"].append({**row, "core": snap})
            print(_line(row, snap), flush=True)
            _write(args, record)


def _line(row: dict[str, Any], snap: dict[str, Any]) -> str:
    gc_s = sum(v[1] for v in snap["gc"].values())
    return (
        f"rep {row['repeat']} {row['phase']:<5} {row['policy']:<7} {row['workload']}: "
        f"{row['finished']}/{row['requests']} ok, {row['output_tok_s']} tok/s, "
        f"{snap['steps']} steps (median {snap['step_median_s']} s), gc {gc_s:.3f} s, "
        f"unfrozen objects {sum(snap['gc_objects'])}, others {row['others_cpu_s']} s"
    )


def _write(args: argparse.Namespace, record: dict[str, Any]) -> None:
    from feather_lab.bench.record import write_record

    write_record(args.json, config=record["config"], runs=record["runs"],
                 starts=record["starts"], summary=summary(record["runs"], args.phases))  # fmt: skip


def summary(
    runs: list[dict[str, Any]], phases: tuple[tuple[str, str], ...] = PHASES
) -> dict[str, Any]:
    """Per server: each phase's throughput by repeat and its median; for every later
    no-sharing phase, `<phase>_vs_cold` (the first no-sharing phase) by repeat and median
    (throughput, and the engine's step times: `step_ratio`); per phase: feather / vllm by
    repeat and median (for no-sharing, by step times too)."""
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in runs:
        by.setdefault((r["policy"], r["phase"]), {})[r["repeat"]] = r
    sharing_free = [p for p, w in phases if w == "no-sharing"]
    out: dict[str, Any] = {}
    for label in LABELS:
        out[label] = {phase: _tputs(by.get((label, phase), {})) for phase, _ in phases}
        cold = by.get((label, sharing_free[0]), {}) if sharing_free else {}
        for later in sharing_free[1:]:
            after = by.get((label, later), {})
            common = [k for k in cold if k in after]
            ratios = [after[k]["output_tok_s"] / cold[k]["output_tok_s"] for k in common]
            out[label][f"{later}_vs_cold"] = _ratios(ratios)
            steps = [step_ratio(cold[k], after[k]) for k in common]
            out[label][f"{later}_vs_cold_step"] = _ratios([x for x in steps if x is not None])
    for phase, name in phases:
        v, f = by.get(("vllm", phase), {}), by.get(("feather", phase), {})
        pairs = [f[k]["output_tok_s"] / v[k]["output_tok_s"] for k in v if k in f]
        out[f"feather_vs_vllm_{phase}"] = _ratios(pairs)
        if name == "no-sharing":
            steps = [step_ratio(v[k], f[k]) for k in v if k in f]
            out[f"feather_vs_vllm_{phase}_step"] = _ratios([x for x in steps if x is not None])
    return out


def record_phases(record: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The phases a record ran (`config["phases"]`, "name: workload")."""
    return tuple(tuple(p.split(": ", 1)) for p in record["config"]["phases"])  # type: ignore[misc]


def step_ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """The median over steps of b's step time over a's, the two runs' steps paired from the
    end (a no-sharing run's schedule is the same every time, but for whether the first
    arrivals share the first step: 192 or 193 steps), where their shapes agree when both
    logged them. Robust to a burst of other work that stretches a few steps of one run."""
    da, db = a["core"]["step_durations"], b["core"]["step_durations"]
    n = min(len(da), len(db))
    sa, sb = a["core"].get("step_shapes"), b["core"].get("step_shapes")
    pairs = list(zip(da[-n:], db[-n:]))
    if sa and sb:
        pairs = [p for p, x, y in zip(pairs, sa[-n:], sb[-n:]) if x == y]
    ratios = [y / x for x, y in pairs if x > 0]
    return statistics.median(ratios) if ratios else None


def _tputs(reps: dict[int, dict[str, Any]]) -> dict[str, Any]:
    values = [reps[k]["output_tok_s"] for k in sorted(reps)]
    return {"tok_s": values, "median": round(statistics.median(values), 2) if values else None}


def _ratios(values: list[float]) -> dict[str, Any]:
    return {"per_repeat": [round(v, 3) for v in values],
            "median": round(statistics.median(values), 3) if values else None}  # fmt: skip


def show(path: Path) -> str:
    """The record's table: per server and phase, tok/s by repeat, and the ratios."""
    record = json.loads(path.read_text())
    phases = record_phases(record)
    s = summary(record["runs"], phases)
    lines = []
    for label in LABELS:
        for phase, _ in phases:
            t = s[label][phase]
            lines.append(f"{label:<8}{phase:<6} median {t['median']} tok/s, by repeat {t['tok_s']}")
        for key in [k for k in s[label] if k.endswith(("_vs_cold", "_vs_cold_step"))]:
            r = s[label][key]
            lines.append(f"{label:<8}{key}: median {r['median']}, by repeat {r['per_repeat']}")
    for key in [k for k in s if k.startswith("feather_vs_vllm")]:
        r = s[key]
        lines.append(f"{key}: median {r['median']}, by repeat {r['per_repeat']}")
    lines.append(MECHANISM_HEAD)
    lines += [mechanism_line(r) for r in record["runs"]]
    return "\n".join(lines)


MECHANISM_HEAD = (
    "rep phase server   tok/s steps  step_s median_ms sched_s update_s gc_s(passes) "
    "minflt k utime stime  rss_MiB heap_MiB mmap_MiB | feather per-request entries, others_s"
)


def mechanism_line(run: dict[str, Any]) -> str:
    """One run's engine-core account (core_state.py's snapshot after it)."""
    c = run["core"]
    gc_s = sum(v[1] for v in c["gc"].values())
    passes = "/".join(str(c["gc"][g][0]) for g in ("0", "1", "2"))
    u = c.get("rusage") or dict.fromkeys(("minflt", "utime_s", "stime_s"), 0.0)
    m = c.get("malloc") or {}
    mib = 1 << 20
    left = sum(v for k, v in c.get("feather", {}).items() if k in PER_REQUEST)
    return (
        f"{run['repeat']:>3} {run['phase']:<5} {run['policy']:<8}{run['output_tok_s']:>6.1f} "
        f"{c['steps']:>5} {c['step_s']:>7.2f} {1000 * (c['step_median_s'] or 0):>9.1f} "
        f"{c['schedule_s']:>7.3f} {c['update_s']:>8.3f} {gc_s:>5.3f}({passes}) "
        f"{u['minflt'] / 1000:>8.1f} {u['utime_s']:>5.1f} {u['stime_s']:>5.1f} "
        f"{c['rss_kib'] / 1024:>8.0f} {m.get('arena', 0) / mib:>8.0f} "
        f"{m.get('hblkhd', 0) / mib:>8.0f} | "
        f"{left if 'feather' in c else '-'}, {run['others_cpu_s']}"
    )


PER_REQUEST = (
    "tracker_meta", "tracker_waiting_ids", "tracker_running_ids", "cht_requests", "cht_leaf",
    "cht_running", "cht_end_keys", "cht_root_children", "cht_hot", "cht_in_hot",
    "controller_requests", "controller_pending", "queue_members", "feather_steps",
)  # fmt: skip
"""Feather's structures that hold entries per live request: all 0 once a run has finished."""


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.show:
        print(show(args.json))
        return 0
    sys.path.insert(0, str(HERE))
    from core_state import request_snapshot, state_spec
    from replay_ab import server_specs
    from replay_cpu import _held

    from feather_lab.bench.machine import config_provenance
    from feather_lab.bench.suite import BenchSpec
    from feather_lab.harness.vllm_server import served
    from feather_lab.replay.client import preflight
    from feather_lab.replay.workload import replay_workloads

    args.out.mkdir(parents=True, exist_ok=True)
    config = {**config_provenance(), "scenario": args.scenario, "model": "kv-bound"}
    config.update(model_in_core=True, stream_interval=1, reset_prefix_cache=True, limit=args.limit)
    config["feather_options"] = args.feather_options
    config["phases"] = [f"{p}: {w}" for p, w in args.phases]
    record: dict[str, Any] = {"config": config, "runs": [], "starts": []}
    bench = BenchSpec(workloads=("no-sharing", "paper-32g"), limit=args.limit)
    work = {w.name: w for w in replay_workloads(bench, "kv-bound", None, 4096)}
    work = {k: dataclasses.replace(w, name=f"{k} ({args.scenario})") for k, w in work.items()}
    for rep in range(args.repeats):
        if args.no_repeat_after is not None and time.time() > args.no_repeat_after:
            print(f"repeat {rep} not started: past --no-repeat-after", flush=True)
            break
        logs = [(args.out / f"rep{rep}-{label}-core.jsonl").resolve() for label in LABELS]
        specs = server_specs(args.scenario, args.cache, model_in_core=True)
        specs = [state_spec(_with_options(s, args.feather_options), log)
                 for s, log in zip(specs, logs)]  # fmt: skip
        with (
            _held(args.lock),
            tempfile.TemporaryDirectory() as tmp,
            served(specs, Path(tmp)) as servers,
        ):
            starts = [request_snapshot(log, f"{rep}:start") for log in logs]
            record["starts"] += [{"repeat": rep, "policy": lb, "core": s}
                                 for lb, s in zip(LABELS, starts)]  # fmt: skip
            endpoints = [preflight(s.url) for s in servers]
            _run(args, rep, servers, endpoints, logs, work, record)
    print(show(args.json))
    return 0


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    raise SystemExit(main())
