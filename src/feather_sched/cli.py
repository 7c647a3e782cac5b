"""The `feather` command.

Each command reads its options into a spec (the library's own frozen dataclass), runs it,
then reports: a table on the console and, for benchmarks, a JSON record
(`bench.machine.write_record`). Bad input found after option parsing exits with status 2 and
a message on stderr, as the option parser's own errors do.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from feather_sched.bench.machine import write_json, write_record
from feather_sched.bench.suite import DEFAULT_HARDWARE, DEFAULT_POLICIES, BenchSpec
from feather_sched.bench.vllm_engine import KvScenario, VllmBenchSpec
from feather_sched.cost import StepCostModel
from feather_sched.sim.config import EngineConfig
from feather_sched.sim.result import SLO

app = typer.Typer(
    help="Feather: prefix-homogeneity-aware scheduling for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
)
trace_app = typer.Typer(help="Inspect request traces (Mooncake JSONL or Feather JSONL).")
app.add_typer(trace_app, name="trace")
console = Console(width=None if sys.stdout.isatty() else 150)
err_console = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        from feather_sched.bench.runner import git_commit, package_version

        commit = git_commit()
        print(f"feather {package_version()}" + (f" (git {commit})" if commit else ""))
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version."
        ),
    ] = False,
) -> None:
    """Feather: prefix-homogeneity-aware scheduling for LLM serving."""


@app.command("list")
def list_cmd(
    what: Annotated[
        str | None,
        typer.Argument(help="policies, workloads, hardware or models (default: all)."),
    ] = None,
) -> None:
    """The names `feather bench` takes: policies, workloads, hardware and model profiles."""
    from feather_sched.bench.results import catalogue

    cat = catalogue()
    if what is not None and what not in cat:
        _fail(ValueError(f"nothing called {what!r} to list; valid: {', '.join(cat)}"))
    for section, items in cat.items():
        if what is not None and section != what:
            continue
        print(f"{section}:")
        for name, line in items:
            print(f"  {name:<18} {line}".rstrip())


@app.command("show")
def show_cmd(
    record: Annotated[Path, typer.Argument(help="A `feather bench --json` record.")],
    csv_out: Annotated[bool, typer.Option("--csv", help="Every row field as CSV.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="A Markdown table.")] = False,
) -> None:
    """Print a saved bench record: its table (default), CSV or Markdown."""
    from feather_sched.bench.output import results_text, terminal_width
    from feather_sched.bench.results import read_record, rows_csv, rows_markdown

    if csv_out and markdown:
        _fail(ValueError("--csv and --markdown: pick one"))
    try:
        payload = read_record(record)
    except ValueError as err:
        _fail(err)
    rows = payload["rows"]
    if csv_out:
        sys.stdout.write(rows_csv(rows))
    elif markdown:
        print(rows_markdown(rows))
    else:
        cfg = payload.get("config") or {}
        title = f"{record}: " + ", ".join(
            f"{k} {cfg[k]}" for k in ("hardware", "model", "kernel", "seed") if k in cfg
        )
        print(results_text(rows, title, terminal_width()))


@app.command("compare")
def compare_cmd(
    a: Annotated[Path, typer.Argument(help="Record A (the reference).")],
    b: Annotated[Path, typer.Argument(help="Record B.")],
) -> None:
    """Two saved bench records side by side: each (workload, policy) in both, B / A."""
    from feather_sched.bench.results import compare_text, read_record

    try:
        ra, rb = read_record(a), read_record(b)
    except ValueError as err:
        _fail(err)
    print(compare_text(ra["rows"], rb["rows"], str(a), str(b)))


# ---- options shared by several commands

_Hardware = Annotated[
    str,
    typer.Option(
        help="Hardware profile name or JSON file (`feather list hardware` says where each "
        "comes from: measured, derived or estimate)."
    ),
]
_Kernel = Annotated[str, typer.Option(help="Attention kernel: paged or ideal.")]
_Seed = Annotated[int, typer.Option()]

# ---- `feather bench` options

_BenchWorkloads = Annotated[
    list[str],
    typer.Option(
        "--workload",
        "-w",
        help="Workload name or trace:PATH; repeat or comma-separate. Default: the built-in suite.",
    ),
]
_BenchPolicies = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated policies to compare. Default: "
        + ",".join(DEFAULT_POLICIES)
        + " (sim); grouped and feather against vLLM's own scheduler (--engine vllm); "
        "SGLang's own fcfs, lpm, dfs-weight beside Feather's (--engine sglang; default "
        "fcfs,lpm,feather).",
    ),
]
_BenchModel = Annotated[
    str | None,
    typer.Option(
        help="Model profile name or JSON file (sim; default llama-3.1-8b). --engine vllm: a "
        "random-weight Llama built locally, tiny-llama (default) or kv-bound (KV-read-bound "
        "decode, its own workloads: paper-32g, paper-4g, no-sharing), or a model directory.",
    ),
]
_BenchMaxNumSeqs = Annotated[
    int | None,
    typer.Option(min=1, help="Engine max running sequences (default 256; 500 for paper-*)."),
]
_MaxBatchedTokens = Annotated[int, typer.Option(min=1, help="Engine token budget per step.")]
_KvBlocks = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="KV cache blocks (sim default: sized from the hardware memory; --engine vllm "
        "default: two runs, under KV pressure and without).",
    ),
]
_PolicyState = Annotated[
    Path | None,
    typer.Option(
        "--policy-state",
        help="Feather bandit table: loaded if the file exists (warm start), saved after the "
        "run (--engine vllm: after each feather run, so later repeats start warm).",
    ),
]
_BenchFeatherHardware = Annotated[
    str | None,
    typer.Option(
        help="Hardware profile (name or JSON) the feather policy takes as its step-cost prior. "
        "Sim: default the bench's own --hardware, 'none' for no prior. --engine vllm: default "
        "none; pass the profile `feather calibrate` fitted for this machine.",
    ),
]
_BenchJson = Annotated[Path, typer.Option("--json", help="JSON results.")]
_BenchPlot = Annotated[Path, typer.Option("--plot", help="Plot: .png, .pdf, .svg or .jpg.")]
_BenchEngine = Annotated[
    str,
    typer.Option(
        help="sim: the simulator; vllm: the real vLLM engine (needs the 'vllm' extra); "
        "sglang: SGLang's real scheduler loop with a stand-in forward (the 'sglang' extra)."
    ),
]
_BenchRepeats = Annotated[int, typer.Option(min=1, help="Runs per configuration (--engine vllm).")]
_AsyncScheduling = Annotated[
    bool,
    typer.Option(
        "--async-scheduling",
        help="--engine vllm: run vLLM's async scheduling (the GPU default), also on CPU.",
    ),
]
_BenchReplicas = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Simulate a cluster of N replicas behind each of --routers (bench.cluster).",
    ),
]
_BenchRouters = Annotated[
    str | None,
    typer.Option(
        help="With --replicas: comma-separated routers (pow2, prefix-affinity, feather; "
        "default all three), each over its replica policy (fcfs, fcfs, feather).",
    ),
]
_DropOverlong = Annotated[
    bool,
    typer.Option(
        "--drop-overlong",
        help="Drop requests longer than the model's context (prompt + output), counted in "
        "the row as dropped_overlong; without it such a workload is an error.",
    ),
]


_Arrival = Annotated[
    str | None,
    typer.Option(
        help="Arrival process of generated workloads: all, poisson:RATE (requests/s) or "
        "bursts:SIZE:INTERVAL. Default: each workload's own (all at once). Not for traces.",
    ),
]
_RateScale = Annotated[
    float | None,
    typer.Option(
        help="Multiply the request rate (arrival times divided by it), e.g. 10 replays a "
        "trace 10x faster.",
    ),
]
_Limit = Annotated[
    int | None,
    typer.Option(help="Keep each workload's first N requests (by arrival)."),
]
_SloTtft = Annotated[
    float | None,
    typer.Option(help="SLO on time to first token, seconds (goodput counts requests within)."),
]
_SloTpot = Annotated[
    float | None,
    typer.Option(help="SLO on time per output token, seconds (goodput counts requests within)."),
]
_Rates = Annotated[
    str | None,
    typer.Option(
        help="Latency-throughput sweep: comma-separated request rates (req/s); each workload "
        "runs at each (Poisson arrivals; a trace rescaled to that mean rate), plotted.",
    ),
]
_StepsOut = Annotated[
    Path | None,
    typer.Option(
        help="Write the step log (JSONL): one line per step with batch, prefix groups, "
        "admitted ids and every ADD/STOP with its features.",
    ),
]


def _names(items: Sequence[str] | None) -> list[str]:
    """Names from an option that may be repeated and comma-separated; blanks dropped."""
    return [w.strip() for item in (items or []) for w in item.split(",") if w.strip()]


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


def _float_list(text: str, option: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{option} expects comma-separated numbers, got {text!r}") from None
    if not values:
        raise ValueError(f"{option} {text!r} names no value")
    return values


def _fail(err: Exception) -> NoReturn:
    """Bad input found past option parsing: its message on stderr (markup-escaped, so a
    bracket in it prints as written) and exit status 2, as the option parser's errors."""
    err_console.print(f"[red]error:[/red] {escape(str(err))}", soft_wrap=True)
    raise typer.Exit(2) from None


def _optional_names(text: str | None, option: str) -> list[str] | None:
    """Names of a comma-separated option; None when not given; an error when given empty."""
    if text is None:
        return None
    names = _names([text])
    if not names:
        _fail(ValueError(f"{option} {text!r} names nothing; give at least one name"))
    return names


@app.command("bench")
def bench(
    workload: _BenchWorkloads = None,
    policies: _BenchPolicies = None,
    hardware: _Hardware = DEFAULT_HARDWARE,
    model: _BenchModel = None,
    kernel: _Kernel = "paged",
    seed: Annotated[int, typer.Option(min=0, help="Workload seed.")] = 0,
    max_num_seqs: _BenchMaxNumSeqs = None,
    max_batched_tokens: _MaxBatchedTokens = 8192,
    num_kv_blocks: _KvBlocks = None,
    policy_state: _PolicyState = None,
    feather_hardware: _BenchFeatherHardware = None,
    json_out: _BenchJson = Path("feather-bench.json"),
    plot: _BenchPlot = Path("feather-bench.png"),
    engine: _BenchEngine = "sim",
    repeats: _BenchRepeats = 3,
    async_scheduling: _AsyncScheduling = False,
    drop_overlong: _DropOverlong = False,
    arrival: _Arrival = None,
    rate_scale: _RateScale = None,
    limit: _Limit = None,
    slo_ttft: _SloTtft = None,
    slo_tpot: _SloTpot = None,
    steps_out: _StepsOut = None,
    rates: _Rates = None,
    replicas: _BenchReplicas = None,
    routers: _BenchRouters = None,
) -> None:
    """Run every policy on every workload (simulated, or on vLLM); table, JSON and a plot.
    With --replicas N: every router on a simulated N-replica cluster instead."""
    workloads = _optional_names(",".join(workload), "--workload") if workload else None
    policy_list = _optional_names(policies, "--policies")
    if engine != "sim":
        sim_only = {
            "--arrival": arrival,
            "--rate-scale": rate_scale,
            "--limit": limit,
            "--slo-ttft": slo_ttft,
            "--slo-tpot": slo_tpot,
            "--rates": rates,
            "--replicas": replicas,
            "--routers": routers,
        }
        given = [k for k, v in sim_only.items() if v is not None]
        if given:
            only = f"{', '.join(given)}: simulator only for now"
            _fail(ValueError(f"{only} (drop --engine {engine})"))
    if engine == "vllm":
        vllm_spec = VllmBenchSpec(
            workloads=workloads,
            policies=policy_list or _default_vllm_policies(),
            model=model,
            scenarios=_kv_scenarios(num_kv_blocks),
            max_num_seqs=max_num_seqs or VllmBenchSpec.max_num_seqs,
            max_num_batched_tokens=max_batched_tokens,
            repeats=repeats,
            seed=seed,
            policy_state=policy_state,
            async_scheduling=async_scheduling,
            policy_options=feather_prior_options(feather_hardware, model),
            drop_overlong=drop_overlong,
            steps_out=steps_out,
        )
        return _bench_vllm(vllm_spec, json_out, plot)
    if engine == "sglang":
        return _bench_sglang(locals(), json_out, plot)
    if engine != "sim":
        raise typer.BadParameter(
            f"expected sim, vllm or sglang, got {engine!r}", param_hint="--engine"
        )
    try:
        spec = BenchSpec(
            workloads=workloads or list(BenchSpec.workloads),
            policies=policy_list or list(DEFAULT_POLICIES),
            hardware=hardware,
            model=model or BenchSpec.model,  # one default, the spec's
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
            arrival=arrival,
            rate_scale=rate_scale,
            limit=limit,
            slo=SLO(slo_ttft, slo_tpot),
            steps_out=steps_out,
            rates=None if rates is None else _float_list(rates, "--rates"),
        )
    except ValueError as err:
        _fail(err)
    if replicas is not None or routers is not None:
        from feather_sched.bench.cluster import cli_cluster_bench

        return cli_cluster_bench(spec, replicas or 4, routers, json_out, console, _fail)
    _bench_sim(spec, json_out, plot)


def _bench_sim(spec: BenchSpec, json_out: Path, plot: Path) -> None:
    """`feather bench` (the simulator): everything checked, then the runs with rows printed
    as each workload finishes; the JSON is written first, then the plot."""
    from feather_sched.bench.runner import SimBench

    try:
        sim = SimBench.prepare(spec, json_out, plot)
    except (ValueError, OSError, KeyError) as err:
        _fail(err)
    except KeyboardInterrupt:
        err_console.print("interrupted before any run; nothing written")
        raise typer.Exit(130) from None
    raise typer.Exit(sim.run())


def _default_vllm_policies() -> list[str]:
    """The real-engine bench's policies when none are named: grouped, and feather when it is
    registered (vLLM's own scheduler always runs, as the baseline)."""
    from feather_sched.policies.registry import policy_names

    return ["grouped", *(["feather"] if "feather" in policy_names() else [])]


def _kv_scenarios(num_kv_blocks: int | None) -> tuple[KvScenario, ...] | None:
    """One KV scenario of the given size; None leaves the model scale's two."""
    if num_kv_blocks is None:
        return None
    return (KvScenario(f"kv-{num_kv_blocks}-blocks", num_kv_blocks),)


def _bench_vllm(spec: VllmBenchSpec, json_out: Path, plot: Path) -> None:
    """`feather bench --engine vllm`: vLLM's own scheduler vs feather policies, for real."""
    from feather_sched.bench.output import check_output_path, check_plot_path
    from feather_sched.bench.vllm_engine import run_vllm_bench

    try:
        check_output_path(json_out, "--json")
        check_plot_path(plot)
        if spec.steps_out is not None:
            check_output_path(spec.steps_out, "--steps-out")
        spec.validate()
        with err_console.status("vllm bench") as status:
            rows = run_vllm_bench(spec, on_progress=lambda label: status.update(label))
    except (ValueError, RuntimeError, OSError) as err:
        _fail(err)
    mode = ", async scheduling" if spec.async_scheduling else ""
    model = spec.model or "tiny-llama"
    title = f"feather bench --engine vllm: {model}, seed {spec.seed}, {spec.repeats} runs{mode}"
    _report_bench(rows, title, {"engine": "vllm", **asdict(spec)}, json_out, plot)


def _bench_sglang(opts: dict[str, Any], json_out: Path, plot: Path) -> None:
    """`feather bench --engine sglang`: SGLang's real scheduler loop (bench/sglang_engine.py)."""
    from feather_sched.bench.sglang_engine import BENCH_NOTE, bench_from_cli

    try:
        with console.status("sglang bench") as status:
            rows, title, config = bench_from_cli(
                workloads=_names(opts["workload"]),
                policies=_names([opts["policies"] or ""]),
                model=opts["model"],
                scenarios=_kv_scenarios(opts["num_kv_blocks"]),
                max_num_seqs=opts["max_num_seqs"],
                max_batched_tokens=opts["max_batched_tokens"],
                repeats=opts["repeats"],
                seed=opts["seed"],
                policy_state=opts["policy_state"],
                on_progress=lambda label: status.update(label),
            )
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        _fail(err)
    _report_bench(rows, title, config, json_out, plot)
    console.print(f"[dim]{BENCH_NOTE}[/dim]")


def _report_bench(
    rows: list[dict], title: str, config: dict[str, Any], json_out: Path, plot: Path
) -> None:
    """The real-engine bench's report: the table, the JSON record (first), the plot."""
    from feather_sched.bench.output import results_text, terminal_width
    from feather_sched.bench.report import plot_results
    from feather_sched.bench.runner import config_provenance

    print(results_text(rows, title, terminal_width()), flush=True)
    write_record(json_out, config={**config_provenance(), **config}, rows=rows)
    try:
        plot_results(rows, plot, title)
    except Exception as err:  # the rows are saved; a plot failure only loses the plot
        _fail(RuntimeError(f"rows saved to {json_out}, but the plot failed: {err}"))
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


# ---- `feather calibrate` options

_CalibrateModel = Annotated[
    str | None,
    typer.Option(
        help="tiny-llama (default) or kv-bound (random-weight Llamas built locally), or a "
        "Hugging Face model directory.",
    ),
]
_ModelProfile = Annotated[
    str | None,
    typer.Option(help="Model profile (name or JSON) of a --model directory, for the cost model."),
]
_BaseHardware = Annotated[
    str, typer.Option(help="Hardware profile whose peak figures the fit starts from.")
]
_BenchJsonIn = Annotated[
    Path | None,
    typer.Option(
        help="Real-engine rows from `feather bench --engine vllm --json` to compare with."
    ),
]
_GridPasses = Annotated[
    int,
    typer.Option(min=1, help="Passes over the grid; each sample is the median over passes."),
]
_Quick = Annotated[bool, typer.Option(help="A small grid of compositions (a smoke run).")]
_CalibrateFeatherHardware = Annotated[
    str | None,
    typer.Option(
        help="A fitted hardware profile the compared feather policy takes as its step-cost "
        "prior (e.g. an earlier calibration's --out).",
    ),
]


@app.command("calibrate")
def calibrate(
    engine: Annotated[str, typer.Option(help="Engine to measure (vllm).")] = "vllm",
    model: _CalibrateModel = None,
    model_profile: _ModelProfile = None,
    base_hardware: _BaseHardware = "cpu",
    out: Annotated[Path, typer.Option(help="Fitted hardware profile.")] = Path(
        "feather-hw-fitted.json"
    ),
    json_out: Annotated[Path, typer.Option("--json", help="Report.")] = Path(
        "feather-calibrate.json"
    ),
    bench_json: _BenchJsonIn = None,
    holdout_every: Annotated[int, typer.Option(min=2, help="Hold out every N-th composition.")] = 4,
    repeats: _GridPasses = 5,
    quick: Annotated[
        bool, typer.Option(help="A small grid of compositions (a smoke run).")
    ] = False,
    seed: _Seed = 0,
    feather_hardware: _CalibrateFeatherHardware = None,
) -> None:
    """Measure real step times, fit the cost model's hardware parameters, report its error."""
    from feather_sched.bench.vllm_calibrate import COMPARE_POLICIES, CalibrateSpec, run_calibration

    if engine != "vllm":
        raise typer.BadParameter(
            f"only vllm can be calibrated, got {engine!r}", param_hint="--engine"
        )
    try:
        rows = _read_bench_rows(bench_json)
        bench_spec = VllmBenchSpec(
            model=model,
            policies=COMPARE_POLICIES,
            repeats=1 if quick else VllmBenchSpec.repeats,
            seed=seed,
            policy_options=feather_prior_options(feather_hardware, model),
        )
        spec = CalibrateSpec(
            bench=bench_spec,
            base_hardware=base_hardware,
            model_profile=model_profile,
            holdout_every=holdout_every,
            passes=repeats,
            quick=quick,
            bench_rows=rows,
        )
        with console.status("calibrate") as status:
            report = run_calibration(spec, out, on_progress=lambda label: status.update(label))
    except (ValueError, RuntimeError, FileNotFoundError, KeyError) as err:
        _fail(err)
    _print_calibration(report)
    write_record(json_out, **report)
    console.print(f"wrote {out} and {json_out}")


def _read_bench_rows(path: Path | None) -> list[dict[str, Any]] | None:
    """The rows of a `feather bench --engine vllm` record, or None to run the bench."""
    return None if path is None else json.loads(path.read_text())["rows"]


def _print_calibration(report: dict[str, Any]) -> None:
    """The fit's errors, the fitted parameters, and the end-to-end comparison table."""
    from feather_sched.cost import HardwareProfile

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
    console.print(_end_to_end_table(report["end_to_end"]))


def _end_to_end_table(rows: list[dict[str, Any]]) -> Table:
    """Simulated vs real tokens/s per row, and the model on the real run's own steps (the
    cost model's share of the gap; the rest is the simulator's scheduling)."""
    table = Table(title="end to end: simulated vs real output tokens/s")
    cols = ("workload", "policy", "real tok/s", "sim tok/s", "sim/real", "batch real/sim")
    for col in (*cols, "model on real steps"):
        table.add_column(col, justify="left" if col in ("workload", "policy") else "right")
    for r in rows:
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
    return table


@app.command("probe")
def probe_cmd(
    device: Annotated[
        str, typer.Option(help="cuda (Triton kernel) or cpu (torch reference).")
    ] = "cuda",
    quick: Annotated[bool, typer.Option(help="The small grid (a smoke run).")] = False,
    model: Annotated[
        str | None, typer.Option(help="Model profile; default llama-3-8b (cuda), kv-bound (cpu).")
    ] = None,
    base_hardware: Annotated[
        str | None, typer.Option(help="Profile whose peak figures are kept; default by device.")
    ] = None,
    out: Annotated[Path, typer.Option(help="Fitted hardware profile.")] = Path(
        "feather-probe-profile.json"
    ),
    json_out: Annotated[Path, typer.Option("--json", help="Results.")] = Path("feather-probe.json"),
    plot: Annotated[Path, typer.Option("--plot", help="PNG plot.")] = Path("feather-probe.png"),
) -> None:
    """Time decode steps of random weights on real kernels (no engine), fit the hardware
    profile, report held-out MAPE (feather_sched.probe; benchmarks/gpu/run.sh on a GPU)."""
    from feather_sched.probe.run import ProbeSpec, run_probe, summary_lines

    spec = ProbeSpec(device=device, model=model, quick=quick, base_hardware=base_hardware)
    try:
        report = run_probe(spec, out, json_out, plot, log=lambda s: console.print(escape(s)))
    except (ValueError, RuntimeError, ImportError) as err:
        _fail(err)
    for line in summary_lines(report):
        console.print(escape(line))
    console.print(f"wrote {out}, {json_out}" + (f", {plot}" if report.get("plot") else ""))


@app.command("index-bench")
def index_bench(
    queues: Annotated[
        str, typer.Option(help="Queue sizes, 2,000-token prompts.")
    ] = "1000,10000,100000",
    long_queues: Annotated[
        str, typer.Option(help="Queue sizes for the long-prompt case (20,000-token prompts).")
    ] = "1000,10000",
    xl_queues: Annotated[
        str,
        typer.Option(help="Queue sizes for the 128,000-token case (RAG / agent contexts)."),
    ] = "1000",
    chunk_size: Annotated[
        str,
        typer.Option(
            help="CHT chunk sizes in tokens, comma-separated (16 = one vLLM GPU KV block)."
        ),
    ] = "16,64,512",
    batch: Annotated[int, typer.Option(min=1, help="Admissions per scheduling decision.")] = 32,
    repeats: Annotated[
        int, typer.Option(min=1, help="Timed repetitions per measurement (median).")
    ] = 5,
    seed: _Seed = 0,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write rows to this JSON file.")
    ] = None,
    clock: Annotated[
        str,
        typer.Option(
            help="wall (elapsed) or cpu (process CPU time: fairer on a machine shared with "
            "other work, where long radix passes are descheduled more than short decisions)."
        ),
    ] = "wall",
) -> None:
    """Time prefix detection per scheduling decision: CHT vs radix-tree LPM pass."""
    if clock not in ("wall", "cpu"):
        raise typer.BadParameter(f"--clock must be wall or cpu, got {clock!r}")
    from feather_sched.bench.index_bench import IndexBenchCase, IndexBenchRow, run_cases

    chunks = _int_list(chunk_size, "--chunk-size")
    cases = [IndexBenchCase(q, 2_000, 1_500) for q in _int_list(queues, "--queues")]
    cases += [IndexBenchCase(q, 20_000, 15_000) for q in _int_list(long_queues, "--long-queues")]
    cases += [IndexBenchCase(q, 128_000, 96_000) for q in _int_list(xl_queues, "--xl-queues")]
    rows: list[IndexBenchRow] = []
    with console.status("index-bench") as status:
        for case in cases:
            case_rows = run_cases(
                case,
                chunk_sizes=chunks,
                batch=batch,
                repeats=repeats,
                seed=seed,
                progress=lambda msg: status.update(f"index-bench: {msg}"),
                clock=clock,
            )
            rows += case_rows
            for row in case_rows:
                console.log(
                    f"queue {row.queue:>7,} x {row.prompt_tokens:>7,} tok, chunk "
                    f"{row.chunk_size:>3}: CHT {row.cht_us_per_decision:,.1f} us, radix "
                    f"{row.radix_us_per_decision:,.0f} us, {row.bytes_per_request:,.0f} B/request"
                )
    rows.sort(key=lambda r: (r.chunk_size, r.prompt_tokens, r.queue))
    console.print(_index_table(rows, batch))
    if json_out is not None:
        write_record(json_out, clock=clock, rows=[r.to_dict() for r in rows])
        console.print(f"wrote {json_out}")


def _index_table(rows: Sequence[Any], batch: int) -> Table:
    """Per queue: cost per decision of each index, the speedup, and the insert costs."""
    table = Table(title=f"Prefix detection cost per decision ({batch} admissions)")
    for col in (
        "chunk",
        "queue",
        "prompt tok",
        "CHT us/decision",
        "radix us/decision",
        "speedup",
        "CHT us/insert",
        "radix us/insert",
        "CHT us/finish",
        "bytes/request",
        "digest bytes",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r.chunk_size),
            f"{r.queue:,}",
            f"{r.prompt_tokens:,}",
            f"{r.cht_us_per_decision:,.1f}",
            f"{r.radix_us_per_decision:,.0f}",
            f"{r.decision_speedup:,.0f}x",
            f"{r.cht_us_per_insert:,.1f}",
            f"{r.radix_us_per_insert:,.1f}",
            f"{r.cht_us_per_finish:,.1f}",
            f"{r.bytes_per_request:,.0f}",
            f"{r.digest_bytes_per_request:,.0f}",
        )
    return table


# ---- `feather train` options

_TrainWorkloads = Annotated[
    list[str],
    typer.Option(
        "--workload",
        "-w",
        help="Workload name to train on (repeat or comma-separate; 'mix' = the built-in mix). "
        "Default: the built-in mix (paper long-prefix scenarios, shared-prefix, document-qa).",
    ),
]
_TrainMaxNumSeqs = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Engine max running sequences (default: the bench suite's setting for the "
        "workload, e.g. 500 for paper-*; else 256).",
    ),
]


@app.command("train")
def train_cmd(
    workload: _TrainWorkloads = None,
    steps: Annotated[int, typer.Option(min=1, help="PPO steps (ADD/STOP decisions).")] = 100_000,
    out: Annotated[Path, typer.Option(help="Where to write the weights (.npz).")] = Path(
        "feather_ppo.npz"
    ),
    seed: Annotated[int, typer.Option(help="Training seed (PPO and episode draws).")] = 0,
    hardware: _Hardware = DEFAULT_HARDWARE,
    model: Annotated[str, typer.Option(help="Model profile name or JSON file.")] = "llama-3-8b",
    kernel: _Kernel = "paged",
    max_num_seqs: _TrainMaxNumSeqs = None,
) -> None:
    """Train the feather-ppo policy (PPO on the simulator) and save its weights.

    Use the result with FEATHER_PPO_WEIGHTS=PATH (e.g. for `feather bench`), or copy it over
    src/feather_sched/policies/weights/feather_ppo.npz to ship it. Needs the `rl` extra.
    """
    from feather_sched.rl.train import RLMissingError, TrainConfig, require_rl, train

    try:
        require_rl()
    except RLMissingError as err:
        _fail(err)
    try:
        mix = _training_mix(_names(workload), max_num_seqs)
        StepCostModel(hardware, model, kernel)  # fail fast on bad profiles
    except (ValueError, FileNotFoundError) as err:
        _fail(err)
    config = TrainConfig(steps=steps, seed=seed, hardware=hardware, model=model, kernel=kernel)
    try:
        report = train(out, config, mix)
    except RuntimeError as err:
        _fail(err)
    _print_training(report)


def _training_mix(names: list[str], max_num_seqs: int | None) -> list[Any]:
    """The training workloads: 'mix' (or none named) is the built-in mix; any other name runs
    with the bench suite's engine settings unless --max-num-seqs says otherwise. Each is built
    once here, so an unknown name fails before training starts."""
    from feather_sched.rl.train import DEFAULT_MIX, MixEntry

    mix: list[MixEntry] = []
    for name in names or ["mix"]:
        if name == "mix":
            mix.extend(DEFAULT_MIX)
        else:
            entry = MixEntry(name, max_num_seqs=max_num_seqs or _suite_max_num_seqs(name))
            entry.build()
            mix.append(entry)
    return mix


def _print_training(report: Any) -> None:
    """What training did, and whether it learned: the mean episode throughput of the first
    and the last quarter of episodes (shown once there are at least four)."""
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


@app.command(
    "sglang-bench",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def sglang_bench_cmd(ctx: typer.Context) -> None:
    """CPU cost of one scheduling pass in SGLang's own classes (needs the 'sglang' extra):
    lpm / dfs-weight vs Feather. Options: --sizes 128,1000,10000 --repeats 5 --passes 32
    --seed 0 --json FILE (--help for the list)."""
    if importlib.util.find_spec("sglang") is None:
        _fail(RuntimeError("sglang-bench needs SGLang: see the 'sglang' extra in pyproject.toml"))
    from feather_sched.bench.sglang_pass import main as sglang_pass

    raise typer.Exit(sglang_pass(list(ctx.args)))


@trace_app.command("stats")
def trace_stats_cmd(
    path: Annotated[
        Path, typer.Argument(help="Trace file: Mooncake JSONL (hash_ids) or Feather JSONL.")
    ],
    limit: Annotated[
        int | None, typer.Option(min=1, help="Read only the first N requests.")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the stats as JSON.")
    ] = None,
) -> None:
    """Request count, token totals and the share of prompt tokens that are a shared prefix."""
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
        _fail(err)
    console.print(render_stats(stats, title=f"Trace {path.name}"))
    if json_out is not None:
        write_json(json_out, asdict(stats))
        console.print(f"wrote {json_out}")


if __name__ == "__main__":
    app()
