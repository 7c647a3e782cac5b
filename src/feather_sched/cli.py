"""The `feather` command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from feather_sched.bench.suite import DEFAULT_POLICIES

app = typer.Typer(
    help="Feather: prefix-homogeneity-aware scheduling for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
)
trace_app = typer.Typer(help="Inspect request traces (Mooncake JSONL or Feather JSONL).")
app.add_typer(trace_app, name="trace")
console = Console(width=None if sys.stdout.isatty() else 150)
err_console = Console(stderr=True)


@app.callback()
def _main() -> None:
    """Feather: prefix-homogeneity-aware scheduling for LLM serving."""


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{option} expects comma-separated integers, got {text!r}"
        ) from None
    if any(v < 1 for v in values):
        raise typer.BadParameter(f"{option} values must be >= 1, got {text!r}")
    return values


@app.command("bench")
def bench(
    workload: list[str] = typer.Option(
        None,
        "--workload",
        "-w",
        help="Workload name or trace:PATH; repeat or comma-separate. Default: the built-in suite.",
    ),
    policies: str | None = typer.Option(
        None,
        help="Comma-separated policies to compare. Default: "
        + ",".join(DEFAULT_POLICIES)
        + " (sim); grouped and feather against vLLM's own scheduler (--engine vllm).",
    ),
    hardware: str = typer.Option("h100", help="Hardware profile name or JSON file."),
    model: str | None = typer.Option(
        None,
        help="Model profile name or JSON file (sim; default llama-3.1-8b). --engine vllm: a "
        "random-weight Llama built locally, tiny-llama (default) or kv-bound (KV-read-bound "
        "decode, its own workloads: paper-32g, paper-4g, no-sharing), or a model directory.",
    ),
    kernel: str = typer.Option("paged", help="Attention kernel: paged or ideal."),
    seed: int = typer.Option(0, help="Workload seed."),
    max_num_seqs: int | None = typer.Option(
        None, min=1, help="Engine max running sequences (default 256; 500 for paper-*)."
    ),
    max_batched_tokens: int = typer.Option(8192, min=1, help="Engine token budget per step."),
    num_kv_blocks: int | None = typer.Option(
        None,
        min=1,
        help="KV cache blocks (sim default: sized from the hardware memory; --engine vllm "
        "default: two runs, under KV pressure and without).",
    ),
    policy_state: Path | None = typer.Option(
        None,
        "--policy-state",
        help="Feather bandit table: loaded if the file exists (warm start), saved after the "
        "run (--engine vllm: after each feather run, so later repeats start warm).",
    ),
    feather_hardware: str | None = typer.Option(
        None,
        help="Hardware profile (name or JSON) the feather policy takes as its step-cost prior. "
        "Sim: default the bench's own --hardware, 'none' for no prior. --engine vllm: default "
        "none; pass the profile `feather calibrate` fitted for this machine.",
    ),
    json_out: Path = typer.Option(Path("feather-bench.json"), "--json", help="JSON results."),
    plot: Path = typer.Option(Path("feather-bench.png"), "--plot", help="PNG plot."),
    engine: str = typer.Option(
        "sim", help="sim: the simulator; vllm: the real vLLM engine (needs the 'vllm' extra)."
    ),
    repeats: int = typer.Option(3, min=1, help="Runs per configuration (--engine vllm)."),
    async_scheduling: bool = typer.Option(
        False,
        "--async-scheduling",
        help="--engine vllm: run vLLM's async scheduling (the GPU default), also on CPU.",
    ),
    drop_overlong: bool = typer.Option(
        False,
        "--drop-overlong",
        help="Drop requests longer than the model's context (prompt + output), counted in "
        "the row as dropped_overlong; without it such a workload is an error.",
    ),
) -> None:
    """Run every policy on every workload (simulated, or on vLLM); table, JSON and a plot."""
    if engine == "vllm":
        _bench_vllm(
            workload,
            policies,
            model,
            seed,
            max_num_seqs,
            max_batched_tokens,
            num_kv_blocks,
            repeats,
            json_out,
            plot,
            policy_state,
            async_scheduling,
            feather_hardware,
            drop_overlong,
        )
        return
    if engine != "sim":
        raise typer.BadParameter(f"expected sim or vllm, got {engine!r}", param_hint="--engine")
    policies = policies or ",".join(DEFAULT_POLICIES)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from feather_sched.bench.machine import machine_info
    from feather_sched.bench.report import plot_results, results_table
    from feather_sched.bench.suite import DEFAULT_WORKLOADS, BenchSpec, run_bench
    from feather_sched.sim.config import EngineConfig

    model = model or BenchSpec.model  # one default, the spec's

    names = [w.strip() for item in (workload or []) for w in item.split(",") if w.strip()]
    try:
        spec = BenchSpec(
            workloads=names or list(DEFAULT_WORKLOADS),
            policies=[p.strip() for p in policies.split(",") if p.strip()],
            hardware=hardware,
            model=model,
            kernel=kernel,
            seed=seed,
            engine=EngineConfig(
                max_num_seqs=max_num_seqs or EngineConfig.max_num_seqs,
                max_num_batched_tokens=max_batched_tokens,
                num_kv_blocks=num_kv_blocks,
            ),
            engine_overrides=frozenset({"max_num_seqs"} if max_num_seqs else ()),
            policy_state=policy_state,
            feather_hardware=feather_hardware,
            drop_overlong=drop_overlong,
        )
        spec.validate()
        from feather_sched.sim.cost import StepCostModel

        StepCostModel(hardware, model, kernel)  # fail fast on bad profiles
    except ValueError as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    total = spec.total_runs()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("simulating", total=total)

        def tick(label: str) -> None:
            progress.update(task, advance=1, description=label)

        try:
            rows = run_bench(spec, on_progress=tick)
        except (ValueError, FileNotFoundError) as err:
            progress.stop()
            err_console.print(f"[red]error:[/red] {err}")
            raise typer.Exit(2) from None
    title = f"feather bench: {hardware} + {model}, {kernel} kernel, seed {seed}"
    console.print(results_table(rows, title))
    payload = {
        "machine": machine_info(),
        "config": {
            "hardware": hardware,
            "model": model,
            "kernel": kernel,
            "seed": seed,
            "drop_overlong": drop_overlong,
            "engine": {
                "max_num_seqs": max_num_seqs,
                "max_num_batched_tokens": max_batched_tokens,
                "num_kv_blocks": num_kv_blocks,
            },
        },
        "rows": rows,
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(payload, indent=2) + "\n")
    plot_results(rows, plot, title)
    console.print(f"wrote {json_out} and {plot}")


def _bench_vllm(
    workload: list[str] | None,
    policies: str | None,
    model: str | None,
    seed: int,
    max_num_seqs: int | None,
    max_batched_tokens: int,
    num_kv_blocks: int | None,
    repeats: int,
    json_out: Path,
    plot: Path,
    policy_state: Path | None = None,
    async_scheduling: bool = False,
    feather_hardware: str | None = None,
    drop_overlong: bool = False,
) -> None:
    """`feather bench --engine vllm`: vLLM's own scheduler vs feather policies, for real."""
    from dataclasses import asdict

    from rich.markup import escape

    from feather_sched.bench.machine import machine_info
    from feather_sched.bench.report import plot_results, results_table
    from feather_sched.bench.vllm_engine import (
        KvScenario,
        VllmBenchSpec,
        run_vllm_bench,
    )
    from feather_sched.policies.registry import policy_names

    names = [w.strip() for item in (workload or []) for w in item.split(",") if w.strip()]
    default_policies = ["grouped", *(["feather"] if "feather" in policy_names() else [])]
    chosen = [p.strip() for p in (policies or "").split(",") if p.strip()] or default_policies
    scenarios = None
    if num_kv_blocks is not None:
        scenarios = (KvScenario(f"kv-{num_kv_blocks}-blocks", num_kv_blocks),)
    spec = VllmBenchSpec(
        workloads=names or None,
        policies=chosen,
        model=model,
        scenarios=scenarios,
        max_num_seqs=max_num_seqs or VllmBenchSpec.max_num_seqs,
        max_num_batched_tokens=max_batched_tokens,
        repeats=repeats,
        seed=seed,
        policy_state=policy_state,
        async_scheduling=async_scheduling,
        policy_options=feather_prior_options(feather_hardware, model),
        drop_overlong=drop_overlong,
    )
    try:
        spec.validate()
        with console.status("vllm bench") as status:
            rows = run_vllm_bench(spec, on_progress=lambda label: status.update(label))
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(2) from None
    mode = ", async scheduling" if async_scheduling else ""
    title = (
        f"feather bench --engine vllm: {model or 'tiny-llama'}, seed {seed}, {repeats} runs{mode}"
    )
    console.print(results_table(rows, title))
    payload = {
        "machine": machine_info(),
        "config": {"engine": "vllm", **asdict(spec)},
        "rows": rows,
    }
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    plot_results(rows, plot, title)
    console.print(f"wrote {json_out} and {plot}")


def feather_prior_options(hardware: str | None, model: str | None) -> dict:
    """`policy_options` giving the real-engine feather a step-cost prior: a fitted hardware
    profile and the built-in engine model's own profile (a model directory has none)."""
    if hardware is None or hardware == "none":
        return {}
    from feather_sched.bench.vllm_engine import ENGINE_SCALES

    name = model or "tiny-llama"
    if name not in ENGINE_SCALES:
        raise typer.BadParameter(
            "a prior needs a built-in --model (its profile is known)",
            param_hint="--feather-hardware",
        )
    return {"feather": {"hardware": hardware, "model": name}}


@app.command("calibrate")
def calibrate(
    engine: str = typer.Option("vllm", help="Engine to measure (vllm)."),
    model: str | None = typer.Option(
        None,
        help="tiny-llama (default) or kv-bound (random-weight Llamas built locally), or a "
        "Hugging Face model directory.",
    ),
    model_profile: str | None = typer.Option(
        None, help="Model profile (name or JSON) of a --model directory, for the cost model."
    ),
    base_hardware: str = typer.Option(
        "cpu", help="Hardware profile whose peak figures the fit starts from."
    ),
    out: Path = typer.Option(Path("feather-hw-fitted.json"), help="Fitted hardware profile."),
    json_out: Path = typer.Option(Path("feather-calibrate.json"), "--json", help="Report."),
    bench_json: Path | None = typer.Option(
        None, help="Real-engine rows from `feather bench --engine vllm --json` to compare with."
    ),
    holdout_every: int = typer.Option(4, min=2, help="Hold out every N-th composition."),
    repeats: int = typer.Option(
        5, min=1, help="Passes over the grid; each sample is the median over passes."
    ),
    quick: bool = typer.Option(False, help="A small grid of compositions (a smoke run)."),
    seed: int = typer.Option(0),
    feather_hardware: str | None = typer.Option(
        None,
        help="A fitted hardware profile the compared feather policy takes as its step-cost "
        "prior (e.g. an earlier calibration's --out).",
    ),
) -> None:
    """Measure real step times, fit the cost model's hardware parameters, report its error."""
    from rich.markup import escape

    from feather_sched.bench.machine import machine_info
    from feather_sched.bench.vllm_calibrate import CalibrateSpec, run_calibration
    from feather_sched.sim.cost import HardwareProfile

    if engine != "vllm":
        raise typer.BadParameter(
            f"only vllm can be calibrated, got {engine!r}", param_hint="--engine"
        )
    try:
        rows = None
        if bench_json is not None:
            rows = json.loads(bench_json.read_text())["rows"]
        spec = CalibrateSpec(
            model=model,
            model_profile=model_profile,
            base_hardware=base_hardware,
            holdout_every=holdout_every,
            repeats=repeats,
            quick=quick,
            compare_repeats=1 if quick else 3,
            seed=seed,
            bench_rows=rows,
            policy_options=feather_prior_options(feather_hardware, model),
        )
        with console.status("calibrate") as status:
            report = run_calibration(spec, out, on_progress=lambda label: status.update(label))
    except (ValueError, RuntimeError, FileNotFoundError, KeyError) as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(2) from None
    by_kind = ", ".join(f"{k} {v:.1%}" for k, v in report["heldout_mape_by_kind"].items())
    console.print(
        f"step-time MAPE: train {report['train_mape']:.1%} "
        f"({report['samples']['train']} samples), held-out {report['heldout_mape']:.1%} "
        f"({report['samples']['heldout']} samples: {by_kind})"
    )
    fitted = report["profile"]
    console.print(
        "fitted: "
        + ", ".join(f"{k}={fitted[k]:.4g}" for k in fitted if k in HardwareProfile.FIT_FIELDS)
    )
    table = Table(title="end to end: simulated vs real output tokens/s")
    cols = ("workload", "policy", "real tok/s", "sim tok/s", "sim/real", "batch real/sim")
    for col in (*cols, "model on real steps"):
        table.add_column(col, justify="left" if col in ("workload", "policy") else "right")
    for r in report["end_to_end"]:
        replay = r.get("replay_over_busy")
        table.add_row(
            r["workload"],
            r["policy"],
            f"{r['real_tok_s']:,.0f}",
            f"{r['sim_tok_s']:,.0f}",
            f"{r['sim_over_real']:.2f}",
            f"{r['real_mean_batch']}/{r['sim_mean_batch']}",
            "-" if replay is None else f"{replay:.2f}",
        )
    console.print(table)
    report["machine"] = machine_info()
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {out} and {json_out}")


@app.command("index-bench")
def index_bench(
    queues: str = typer.Option("1000,10000,100000", help="Queue sizes, 2,000-token prompts."),
    long_queues: str = typer.Option(
        "1000,10000", help="Queue sizes for the long-prompt case (20,000-token prompts)."
    ),
    chunk_size: int = typer.Option(64, min=1, help="CHT chunk size in tokens."),
    batch: int = typer.Option(32, min=1, help="Admissions per scheduling decision."),
    repeats: int = typer.Option(5, min=1, help="Timed repetitions per measurement (median)."),
    seed: int = typer.Option(0),
    json_out: Path | None = typer.Option(None, "--json", help="Write rows to this JSON file."),
) -> None:
    """Time prefix detection per scheduling decision: CHT vs radix-tree LPM pass."""
    from feather_sched.bench.index_bench import IndexBenchCase, run_case
    from feather_sched.bench.machine import machine_info

    cases = [IndexBenchCase(q, 2_000, 1_500) for q in _int_list(queues, "--queues")]
    cases += [IndexBenchCase(q, 20_000, 15_000) for q in _int_list(long_queues, "--long-queues")]
    rows = []
    with console.status("index-bench") as status:
        for case in cases:
            row = run_case(
                case,
                chunk_size=chunk_size,
                batch=batch,
                repeats=repeats,
                seed=seed,
                progress=lambda msg: status.update(f"index-bench: {msg}"),
            )
            rows.append(row)
            console.log(
                f"queue {row.queue:>7,} x {row.prompt_tokens:>6,} tok: "
                f"CHT {row.cht_us_per_decision:,.1f} us, radix {row.radix_us_per_decision:,.0f} us"
            )
    table = Table(title=f"Prefix detection cost per decision ({batch} admissions)")
    for col in (
        "queue",
        "prompt tok",
        "CHT us/decision",
        "radix us/decision",
        "speedup",
        "CHT us/insert",
        "radix us/insert",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r.queue:,}",
            f"{r.prompt_tokens:,}",
            f"{r.cht_us_per_decision:,.1f}",
            f"{r.radix_us_per_decision:,.0f}",
            f"{r.decision_speedup:,.0f}x",
            f"{r.cht_us_per_insert:,.1f}",
            f"{r.radix_us_per_insert:,.1f}",
        )
    console.print(table)
    if json_out is not None:
        payload = {"machine": machine_info(), "rows": [r.to_dict() for r in rows]}
        json_out.write_text(json.dumps(payload, indent=2) + "\n")
        console.print(f"wrote {json_out}")


@app.command("train")
def train_cmd(
    workload: list[str] = typer.Option(
        None,
        "--workload",
        "-w",
        help="Workload name to train on (repeat or comma-separate; 'mix' = the built-in mix). "
        "Default: the built-in mix (paper long-prefix scenarios, shared-prefix, document-qa).",
    ),
    steps: int = typer.Option(100_000, min=1, help="PPO steps (ADD/STOP decisions)."),
    out: Path = typer.Option(Path("feather_ppo.npz"), help="Where to write the weights (.npz)."),
    seed: int = typer.Option(0, help="Training seed (PPO and episode draws)."),
    hardware: str = typer.Option("h100", help="Hardware profile name or JSON file."),
    model: str = typer.Option("llama-3-8b", help="Model profile name or JSON file."),
    kernel: str = typer.Option("paged", help="Attention kernel: paged or ideal."),
    max_num_seqs: int | None = typer.Option(
        None,
        min=1,
        help="Engine max running sequences (default: the bench suite's setting for the "
        "workload, e.g. 500 for paper-*; else 256).",
    ),
) -> None:
    """Train the feather-ppo policy (PPO on the simulator) and save its weights.

    Use the result with FEATHER_PPO_WEIGHTS=PATH (e.g. for `feather bench`), or copy it over
    src/feather_sched/policies/weights/feather_ppo.npz to ship it. Needs the `rl` extra.
    """
    from rich.markup import escape

    from feather_sched.rl.train import (
        DEFAULT_MIX,
        MixEntry,
        RLMissingError,
        TrainConfig,
        require_rl,
        train,
    )

    try:
        require_rl()
    except RLMissingError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")  # keep ".[rl]" literal
        raise typer.Exit(2) from None
    names = [w.strip() for item in (workload or []) for w in item.split(",") if w.strip()]
    mix: list[MixEntry] = []
    try:
        for name in names or ["mix"]:
            if name == "mix":
                mix.extend(DEFAULT_MIX)
            else:
                entry = MixEntry(name, max_num_seqs=max_num_seqs or _suite_max_num_seqs(name))
                entry.build()  # fail fast on unknown names
                mix.append(entry)
        from feather_sched.sim.cost import StepCostModel

        StepCostModel(hardware, model, kernel)  # fail fast on bad profiles
    except (ValueError, FileNotFoundError) as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    config = TrainConfig(steps=steps, seed=seed, hardware=hardware, model=model, kernel=kernel)
    try:
        report = train(out, config, mix)
    except RuntimeError as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    curve = report.episode_tok_s
    console.print(
        f"trained {report.steps:,} decisions over {report.episodes} episodes in "
        f"{report.seconds:,.0f} s; wrote {report.out}"
    )
    if len(curve) >= 4:
        k = max(1, len(curve) // 4)
        first, last = sum(curve[:k]) / k, sum(curve[-k:]) / k
        console.print(
            f"episode output tok/s (mixed workloads): first {k} {first:,.0f}, last {k} {last:,.0f}"
        )


def _suite_max_num_seqs(workload: str) -> int:
    """The bench suite's max_num_seqs for a workload (what `feather bench` runs it with)."""
    from feather_sched.bench.suite import SUITE

    suite = SUITE.get(workload)
    return int(suite.engine.get("max_num_seqs", 256)) if suite else 256


@trace_app.command("stats")
def trace_stats_cmd(
    path: Path = typer.Argument(
        ..., help="Trace file: Mooncake JSONL (hash_ids) or Feather JSONL."
    ),
    limit: int | None = typer.Option(None, min=1, help="Read only the first N requests."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the stats as JSON."),
) -> None:
    """Request count, token totals and the share of prompt tokens that are a shared prefix."""
    from dataclasses import asdict

    from feather_sched.workloads.stats import render_stats, trace_stats
    from feather_sched.workloads.traces import TraceFormatError, read_trace

    if not path.is_file():
        raise typer.BadParameter(f"no such file: {path}", param_hint="PATH")
    try:
        with console.status(f"reading {path.name}"):
            requests = read_trace(path, limit=limit)
        with console.status("computing shared prefixes"):
            stats = trace_stats(requests)
    except TraceFormatError as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    console.print(render_stats(stats, title=f"Trace {path.name}"))
    if json_out is not None:
        json_out.write_text(json.dumps(asdict(stats), indent=2) + "\n")
        console.print(f"wrote {json_out}")


if __name__ == "__main__":
    app()
