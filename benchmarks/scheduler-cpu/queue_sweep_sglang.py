"""The queue-length sweep in SGLang's real scheduler loop: the very requests
of `queue_sweep.py` (its `traffic(n)`, all waiting at t=0) served by SGLang 0.5.23's own
`Scheduler` on CPU (`harness.sglang_engine`), its model forward a stand-in that sleeps the
step time the measured H200 profile + Llama-3.1-8B gives each batch's real shape.

Everything else on the clock is real CPU time on this host: SGLang's loop, its policies
(fcfs, lpm and hrrn with their fallback to fcfs above 128 waiting, dfs-weight) and Feather's
plugin. The loop is SGLang's normal (synchronous) event loop: each step's scheduler CPU adds
to the stand-in's step, as `queue_sweep.py --sync` models it. Engine limits are the
simulator's (vLLM V1 defaults): 256 running, 8,192 prefill tokens a step, the KV tokens an
H200 holds for the model. Token ids are taken modulo the stand-in's vocabulary (512): the
prefix structure is the same.

One scheduler process per cell; with --repeats R the cells run R times, interleaved (every
policy of a size once before the next repeat). The JSON record is rewritten after each cell
(--resume continues one), so a long sweep keeps what finished.

Usage: python benchmarks/scheduler-cpu/queue_sweep_sglang.py [--sizes 128,1000] [--policies ...]
           [--repeats 1] [--lock FILE] [--hold cell|size] [--resume]
           [--json ...] [--plot ...] [--sim ...]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import re
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from queue_sweep import HARDWARE, MODEL, SHAPE, traffic

from feather_lab.bench.record import write_record
from feather_lab.harness.sglang_engine import serve
from feather_lab.harness.sglang_spec import ServeRequest, ServeSpec
from feather_lab.harness.sglang_suite import _run_row
from feather_lab.harness.tiny_llama import TINY_LLAMA
from feather_lab.sim.config import EngineConfig
from feather_sched.cost import StepCostModel

POLICIES = ("fcfs", "lpm", "dfs-weight", "hrrn", "feather")
SGLANG_OWN = ("fcfs", "lpm", "dfs-weight", "hrrn")
"""Run as SGLang's `--schedule-policy`; the rest through Feather's plugin (on SGLang's fcfs)."""
ENGINE = EngineConfig()


def requests(n: int) -> list[ServeRequest]:
    vocab = TINY_LLAMA.vocab_size
    return [
        ServeRequest(
            rid=f"q{n}-{i:05d}",
            prompt=[int(t) % vocab for t in r.prompt],
            output_len=int(r.output_len),
            arrival_s=float(r.arrival_time),
            group=r.group,
        )
        for i, r in enumerate(traffic(n))
    ]


def serve_spec(n: int, policy: str) -> ServeSpec:
    cost = StepCostModel(HARDWARE, MODEL)
    own = policy in SGLANG_OWN
    return ServeSpec(
        runs=[requests(n)],
        feather_policy=None if own else policy,
        schedule_policy=policy if own else "fcfs",
        policy_options={} if own else {"hardware": HARDWARE, "model": MODEL},
        model=TINY_LLAMA,
        max_total_tokens=ENGINE.kv_blocks(cost.hardware, cost.model) * ENGINE.block_size,
        max_running_requests=ENGINE.max_num_seqs,
        chunked_prefill_size=ENGINE.max_num_batched_tokens,
        max_prefill_tokens=ENGINE.max_num_batched_tokens,
        step_cost=(HARDWARE, MODEL),
        run_timeout_s=3600.0,
    )


def run_cell(n: int, policy: str, rep: int) -> dict:
    """One scheduler process serving the n requests; the run's row plus where its time went."""
    spec = serve_spec(n, policy)
    report = serve(spec)
    run = report["runs"][0]
    row = {"waiting": n, "policy": policy, "repeat": rep, **_run_row(run, spec.runs[0])}
    loop, span = run["loop"], row["makespan_s"]
    sched_cpu = loop["loop_cpu_s"] - loop["stand_in_cpu_s"] - loop["pricing_cpu_s"]
    off_step = span - loop["stand_in_s"] - loop["pricing_s"]
    row.update(
        sched_cpu_share=round(sched_cpu / span, 4),
        sched_wall_share=round(off_step / span, 4),
        pick_cpu_share=round(loop["pick_cpu_s"] / span, 4),
        sched_cpu_ms_per_step=round(sched_cpu / max(1, loop["steps"]) * 1e3, 3),
        step_ms=round((loop["stand_in_s"] + loop["pricing_s"]) / max(1, loop["steps"]) * 1e3, 3),
        event_loop=report["event_loop"],
        plugin_hooked=report["plugin_hooked"],
    )
    if report["feather"] is not None:
        stats = report["feather"]["stats"]
        row.update({k: stats[k] for k in ("policy_errors", "stops", "deferrals", "decisions")})
    return row


MEDIAN_OF = (
    "output_tok_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "sched_cpu_share",
    "sched_wall_share",
    "pick_cpu_share",
    "sched_cpu_ms_per_step",
    "step_ms",
    "mean_batch",
    "makespan_s",
)


def median_rows(cells: list[dict]) -> list[dict]:
    """One row per (size, policy): medians over its repeats, the spread of its throughput,
    and ratios to fcfs and to the best policy of the size."""
    rows = []
    for key in dict.fromkeys((c["waiting"], c["policy"]) for c in cells):
        runs = [c for c in cells if (c["waiting"], c["policy"]) == key]
        speeds = [c["output_tok_s"] for c in runs]
        row = {"waiting": key[0], "policy": key[1], "repeats": len(runs)}
        row.update({k: round(statistics.median(c[k] for c in runs), 4) for k in MEDIAN_OF})
        row["output_tok_s_runs"] = speeds
        row["spread"] = round((max(speeds) - min(speeds)) / row["output_tok_s"], 4)
        rows.append(row)
    for r in rows:
        same = [x for x in rows if x["waiting"] == r["waiting"]]
        fcfs = [x["output_tok_s"] for x in same if x["policy"] == "fcfs"]
        r["vs_fcfs"] = round(r["output_tok_s"] / fcfs[0], 4) if fcfs else None
        r["vs_best"] = round(r["output_tok_s"] / max(x["output_tok_s"] for x in same), 4)
    return rows


def order(rows: list[dict], n: int) -> list[str]:
    """Policies of size n, fastest first."""
    same = sorted((r for r in rows if r["waiting"] == n), key=lambda r: -r["output_tok_s"])
    return [r["policy"] for r in same]


def compare(rows: list[dict], sim_path: str) -> list[dict]:
    """Per size: the loop's order of the policies beside the simulator's (its rows of the
    same policies), with each policy's simulated throughput x fcfs (none: no such record)."""
    if not Path(sim_path).is_file():
        return []
    sim = json.loads(Path(sim_path).read_text())["rows"]
    out = []
    for n in sorted({r["waiting"] for r in rows}):
        ran = {r["policy"] for r in rows if r["waiting"] == n}
        sim_rows = [r for r in sim if r["waiting"] == n and r["policy"] in ran]
        loop_order = order(rows, n)
        sim_order = order(sim_rows, n)
        out.append(
            {
                "waiting": n,
                "loop_order": loop_order,
                "sim_order": sim_order,
                "same": loop_order == sim_order,
                "sim_vs_fcfs": {r["policy"]: r.get("vs_fcfs") for r in sim_rows},
            }
        )
    return out


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for policy in dict.fromkeys(r["policy"] for r in rows):
        pts = sorted((r["waiting"], r["output_tok_s"]) for r in rows if r["policy"] == policy)
        ax.plot(*zip(*pts), marker="o", label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("requests waiting at t=0")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"SGLang 0.5.23's loop, forward timed by {HARDWARE} + {MODEL}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


@contextmanager
def held(lock: str | None):
    """The shared benchmark lock (flock), held for one cell so others' runs interleave."""
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128,1000,10000")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--lock", default=None, help="a file to flock around each cell")
    ap.add_argument("--hold", choices=("cell", "size"), default="cell", help="lock per ...")
    ap.add_argument("--table", action="store_true", help="print --json as markdown, run nothing")
    ap.add_argument("--resume", action="store_true", help="keep the cells of --json")
    ap.add_argument("--json", default="benchmarks/scheduler-cpu/sglang.json")
    ap.add_argument("--plot", default="benchmarks/scheduler-cpu/sglang.png")
    ap.add_argument("--sim", default="benchmarks/scheduler-cpu/sglang-sim-sync.json")
    args = ap.parse_args(argv)
    bad = [p for p in args.policies.split(",") if p not in POLICIES]
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        sizes = [0]
    if bad or min(sizes) < 1 or args.repeats < 1:
        ap.exit(2, f"bad --policies {bad} (valid: {','.join(POLICIES)}), --sizes or --repeats\n")
    return args


def table(path: str) -> None:
    """The record's rows and order comparison as markdown (for the note)."""
    record = json.loads(Path(path).read_text())
    print("| waiting | policy | tok/s | x fcfs | x best | TTFT p50 / p99 s | sched CPU % "
          "| off-step % | pick CPU % | sched CPU ms/step | step ms | runs (spread) |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in record["rows"]:
        vs_fcfs = "-" if r["vs_fcfs"] is None else f"{r['vs_fcfs']:.3f}"
        spread = f"{100 * r['spread']:.1f}%" if r["repeats"] > 1 else "n/a"
        print(
            f"| {r['waiting']:,} | {r['policy']} | {r['output_tok_s']:,.0f} | {vs_fcfs} "
            f"| {r['vs_best']:.3f} | {r['ttft_p50_s']:.1f} / {r['ttft_p99_s']:.1f} "
            f"| {100 * r['sched_cpu_share']:.1f} | {100 * r['sched_wall_share']:.1f} "
            f"| {100 * r['pick_cpu_share']:.1f} | {r['sched_cpu_ms_per_step']:.1f} "
            f"| {r['step_ms']:.1f} | {r['repeats']} ({spread}) |"
        )
    print("\n| waiting | SGLang loop, fastest first | simulator (sync), fastest first |")
    print("|---:|---|---|")
    for c in record["order_vs_simulator"]:
        sim = [f"{p} {c['sim_vs_fcfs'][p]:.3f}" for p in c["sim_order"]]
        print(f"| {c['waiting']:,} | {' > '.join(c['loop_order'])} | {' > '.join(sim)} |")


def main() -> None:
    args = parse()
    if args.table:
        table(args.json)
        return
    cells = json.loads(Path(args.json).read_text())["cells"] if args.resume else []
    commands = [*(json.loads(Path(args.json).read_text())["commands"] if args.resume else [])]
    commands.append(
        " ".join(["python benchmarks/scheduler-cpu/queue_sweep_sglang.py", *sys.argv[1:]])
    )
    per_size = args.hold == "size"
    for rep in range(args.repeats):
        for n in (int(s) for s in args.sizes.split(",")):
            with held(args.lock if per_size else None):
                for policy in args.policies.split(","):
                    t0 = time.perf_counter()
                    with held(None if per_size else args.lock):
                        cell = run_cell(n, policy, rep)
                    cell["cell_wall_s"] = round(time.perf_counter() - t0, 1)
                    cells.append(cell)
                    print(json.dumps({k: cell.get(k) for k in ("waiting", "policy", *MEDIAN_OF)}))
                    save(args, commands, cells)


def save(args: argparse.Namespace, commands: list[str], cells: list[dict]) -> None:
    rows = median_rows(cells)
    cost = StepCostModel(HARDWARE, MODEL)
    write_record(
        args.json,
        commands=[re.sub(r" --lock \S+", "", c) for c in commands],  # no host's path
        hardware=HARDWARE,
        hardware_provenance=cost.hardware.provenance_note,
        model=MODEL,
        shape=SHAPE,
        engine={
            "sglang": "0.5.23, normal (synchronous) event loop, CPU, stand-in forward",
            "max_running_requests": ENGINE.max_num_seqs,
            "max_prefill_tokens": ENGINE.max_num_batched_tokens,
            "max_total_tokens": serve_spec(1, "fcfs").max_total_tokens,
        },
        order_vs_simulator=compare(rows, args.sim),
        rows=rows,
        cells=cells,
    )
    plot(rows, args.plot)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
