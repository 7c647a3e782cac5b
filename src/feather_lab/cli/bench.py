"""`feather bench`: the simulator, vLLM, SGLang's loop, or a simulated cluster."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from feather_lab.bench.record import write_record
from feather_lab.bench.suite import DEFAULT_HARDWARE, DEFAULT_POLICIES, BenchSpec
from feather_lab.cli.common import (
    app,
    console,
    err_console,
    fail,
    optional_names,
    schedule_fields,
    writable,
)
from feather_lab.cli.options import (
    SCHEDULE,
    AsyncScheduling,
    BenchEngine,
    BenchFeatherHardware,
    BenchJsonOut,
    BenchMaxNumSeqs,
    BenchModel,
    BenchPlot,
    BenchPolicies,
    BenchRepeats,
    BenchReplicas,
    BenchRouters,
    BenchWorkloads,
    Hardware,
    Kernel,
    KvBlocks,
    MaxBatchedTokens,
    PolicyState,
    SchedulerCpu,
    SchedulerSeesOutput,
    StepsOut,
    options_of,
    with_options,
)
from feather_lab.harness.vllm_engine import KvScenario, VllmBenchSpec
from feather_lab.sim.config import SEES_OUTPUT, EngineConfig
from feather_sched.policies.registry import policy_names

BENCH_HELP = (
    "Run the policies on every workload: simulated, on vLLM or on SGLang's loop.\n\n"
    "Prints what ran (the hardware profile, its provenance, the model), what each column "
    "means, a block of rows per workload as it finishes, and a closing summary: per "
    "workload, feather's output tok/s over fcfs's (the engine's default) and over the best "
    "other deployable policy's. Progress goes to stderr.\n\n"
    "Writes the JSON record (--json, default feather-bench.json), then the plot (--plot, "
    "default the JSON's name with .png: --json h200.json gives h200.png). An existing file "
    'is replaced, and stderr says so ("replacing feather-bench.json").\n\n'
    f"Default policies: {len(DEFAULT_POLICIES)} of the {len({*policy_names(), *DEFAULT_POLICIES})} "
    "(see --policies). "
    "With --replicas N: every router on a simulated N-replica cluster instead."
)


@app.command("bench", help=BENCH_HELP)
@with_options(SCHEDULE)
def bench(
    workload: BenchWorkloads = None,
    policies: BenchPolicies = None,
    hardware: Hardware = DEFAULT_HARDWARE,
    model: BenchModel = None,
    kernel: Kernel = "paged",
    max_num_seqs: BenchMaxNumSeqs = None,
    max_batched_tokens: MaxBatchedTokens = 8192,
    num_kv_blocks: KvBlocks = None,
    policy_state: PolicyState = None,
    feather_hardware: BenchFeatherHardware = None,
    json_out: BenchJsonOut = Path("feather-bench.json"),
    plot: BenchPlot = None,
    engine: BenchEngine = "sim",
    repeats: BenchRepeats = 3,
    async_scheduling: AsyncScheduling = False,
    steps_out: StepsOut = None,
    scheduler_cpu: SchedulerCpu = None,
    scheduler_sees_output: SchedulerSeesOutput = None,
    replicas: BenchReplicas = None,
    routers: BenchRouters = None,
    **rest: Any,
) -> None:
    """`feather bench` (BENCH_HELP says what it does)."""
    from feather_lab.bench.output import plot_beside

    plot = plot if plot is not None else plot_beside(json_out)
    opts = options_of(locals(), rest)
    opts["workload"] = optional_names(",".join(workload), "--workload") if workload else None
    opts["policies"] = optional_names(policies, "--policies")
    if engine not in ENGINES:
        fail(ValueError(f"--engine {engine!r}: no such engine; valid: {', '.join(ENGINES)}"))
    if engine != "sim":
        _refuse_sim_only(opts)
    if engine == "vllm":
        return _bench_vllm(_vllm_spec(opts), json_out, plot)
    if engine == "sglang":
        return _bench_sglang(opts, json_out, plot)
    try:
        spec = _sim_spec(opts)
    except ValueError as err:
        fail(err)
    if replicas is not None or routers is not None:
        from feather_lab.bench.cluster import cli_cluster_bench

        outputs = (json_out, plot)
        return cli_cluster_bench(spec, replicas or 4, routers, outputs, fail, opts["policies"])
    _bench_sim(spec, json_out, plot)


ENGINES = ("sim", "vllm", "sglang")
"""What --engine takes."""
SIM_ONLY = (
    "arrival",
    "rate_scale",
    "limit",
    "slo_ttft",
    "slo_tpot",
    "rates",
    "replicas",
    "routers",
    "scheduler_cpu",
    "scheduler_sees_output",
)
"""Options only the simulator takes (for now)."""


def _refuse_sim_only(opts: dict[str, Any]) -> None:
    given = ["--" + k.replace("_", "-") for k in SIM_ONLY if opts[k] is not None]
    if given:
        only = f"{', '.join(given)}: simulator only for now"
        fail(ValueError(f"{only} (drop --engine {opts['engine']})"))


PASSED_ON = ("seed", "policy_state", "drop_overlong", "steps_out")
"""Options every engine's spec takes under the option's own name and meaning."""


def _passed_on(opts: dict[str, Any]) -> dict[str, Any]:
    return {k: opts[k] for k in PASSED_ON}


def _vllm_spec(opts: dict[str, Any]) -> VllmBenchSpec:
    """The real-vLLM bench's spec from the command's options."""
    return VllmBenchSpec(
        workloads=opts["workload"],
        policies=opts["policies"] or _default_vllm_policies(),
        model=opts["model"],
        scenarios=_kv_scenarios(opts["num_kv_blocks"]),
        max_num_seqs=opts["max_num_seqs"] or VllmBenchSpec.max_num_seqs,
        max_num_batched_tokens=opts["max_batched_tokens"],
        repeats=opts["repeats"],
        async_scheduling=opts["async_scheduling"],
        policy_options=feather_prior_options(opts["feather_hardware"], opts["model"]),
        **_passed_on(opts),
    )


def _sim_spec(opts: dict[str, Any]) -> BenchSpec:
    """The simulator bench's spec (a ValueError names a bad value)."""
    max_num_seqs = opts["max_num_seqs"]
    sees = _given(opts["scheduler_sees_output"], EngineConfig.scheduler_sees_output)
    if sees not in SEES_OUTPUT:
        raise ValueError(f"--scheduler-sees-output {sees!r}: valid: {', '.join(SEES_OUTPUT)}")
    return BenchSpec(
        workloads=opts["workload"] or list(BenchSpec.workloads),
        policies=opts["policies"] or list(DEFAULT_POLICIES),
        hardware=opts["hardware"],
        model=opts["model"] or BenchSpec.model,  # one default, the spec's
        kernel=opts["kernel"],
        engine=EngineConfig(
            max_num_seqs=max_num_seqs or EngineConfig.max_num_seqs,
            max_num_batched_tokens=opts["max_batched_tokens"],
            num_kv_blocks=opts["num_kv_blocks"],
            scheduler_sees_output=sees,
        ),
        engine_overrides=frozenset({"max_num_seqs"} if max_num_seqs else ()),
        feather_hardware=opts["feather_hardware"],
        **schedule_fields(opts),
        scheduler_cpu=_given(opts["scheduler_cpu"], BenchSpec.scheduler_cpu),
        **_passed_on(opts),
    )


def _given(value: Any, default: Any) -> Any:
    """An option's value as given (an empty string too: validation names it), else the
    default."""
    return default if value is None else value


def _bench_sim(spec: BenchSpec, json_out: Path, plot: Path) -> None:
    """`feather bench` (the simulator): everything checked, then the runs with rows printed
    as each workload finishes; the JSON is written first, then the plot."""
    from feather_lab.bench.runner import SimBench

    try:
        sim = SimBench.prepare(spec, json_out, plot)
    except (ValueError, OSError, KeyError) as err:
        fail(err)
    except KeyboardInterrupt:
        err_console.print("interrupted before any run; nothing written")
        raise typer.Exit(130) from None
    raise typer.Exit(sim.run())


FEATHER_ROWS = ("feather", "feather-paper", "feather-upstream")
"""Feather and the authors' own policies: beside each other wherever feather runs."""


def _default_vllm_policies() -> list[str]:
    """The real-engine bench's policies when none are named: grouped, then feather and the
    authors' two policies (feather-paper, feather-upstream) when they are registered (vLLM's
    own scheduler always runs, as the baseline)."""
    from feather_sched.policies.registry import policy_names

    known = policy_names()
    return ["grouped", *(p for p in FEATHER_ROWS if p in known)]


def _kv_scenarios(num_kv_blocks: int | None) -> tuple[KvScenario, ...] | None:
    """One KV scenario of the given size; None leaves the model scale's two."""
    if num_kv_blocks is None:
        return None
    return (KvScenario(f"kv-{num_kv_blocks}-blocks", num_kv_blocks),)


def _bench_vllm(spec: VllmBenchSpec, json_out: Path, plot: Path) -> None:
    """`feather bench --engine vllm`: vLLM's own scheduler vs feather policies, for real."""
    from feather_lab.bench.output import check_plot_path
    from feather_lab.harness.vllm_spec import BASELINE as VLLM_BASELINE
    from feather_lab.harness.vllm_suite import run_vllm_bench

    writable(json=json_out, steps_out=spec.steps_out)
    try:
        check_plot_path(plot)
        spec.validate()
        with err_console.status("vllm bench") as status:
            rows = run_vllm_bench(spec, on_progress=lambda label: status.update(label))
    except (ValueError, RuntimeError, OSError) as err:
        fail(err)
    mode = ", async scheduling" if spec.async_scheduling else ""
    model = spec.model or "tiny-llama"
    title = f"feather bench --engine vllm: {model}, seed {spec.seed}, {spec.repeats} runs{mode}"
    config = {"engine": "vllm", **asdict(spec)}
    _report_bench(rows, title, config, (json_out, plot), VLLM_BASELINE)


def _bench_sglang(opts: dict[str, Any], json_out: Path, plot: Path) -> None:
    """`feather bench --engine sglang`: SGLang's real scheduler loop (harness/sglang_engine.py)."""
    from feather_lab.bench.output import check_plot_path
    from feather_lab.harness.sglang_suite import BASELINE as SGLANG_BASELINE
    from feather_lab.harness.sglang_suite import BENCH_NOTE, bench_from_cli

    writable(json=json_out)
    try:
        check_plot_path(plot)
        with console.status("sglang bench") as status:
            rows, title, config = bench_from_cli(
                workloads=opts["workload"] or [],
                policies=opts["policies"] or [],
                model=opts["model"],
                scenarios=_kv_scenarios(opts["num_kv_blocks"]),
                max_num_seqs=opts["max_num_seqs"],
                max_batched_tokens=opts["max_batched_tokens"],
                repeats=opts["repeats"],
                seed=opts["seed"],
                policy_state=opts["policy_state"],
                on_progress=lambda label: status.update(label),
            )
    except (ValueError, RuntimeError, OSError) as err:
        fail(err)
    _report_bench(rows, title, config, (json_out, plot), SGLANG_BASELINE)
    console.print(f"[dim]{BENCH_NOTE}[/dim]")


def _report_bench(
    rows: list[dict],
    title: str,
    config: dict[str, Any],
    outputs: tuple[Path, Path],
    baseline: str,
) -> None:
    """The real-engine bench's report: the table with its legend, the summary over the
    engine's own scheduler (`baseline`), the JSON record (first), the plot."""
    from feather_lab.bench.machine import config_provenance
    from feather_lab.bench.output import replacing, results_text, terminal_width
    from feather_lab.bench.report import plot_results
    from feather_lab.bench.summary import summary_text

    json_out, plot = outputs
    print(results_text(rows, title, terminal_width(), with_legend=True), flush=True)
    summary = summary_text(rows, baseline)
    if summary:
        print(f"\n{summary}\n", flush=True)
    replacing(json_out)
    write_record(json_out, config={**config_provenance(), **config}, rows=rows)
    replacing(plot)
    try:
        plot_results(rows, plot, title)
    except Exception as err:  # the rows are saved; a plot failure only loses the plot
        fail(RuntimeError(f"rows saved to {json_out}, but the plot failed: {err}"))
    console.print(f"wrote {json_out}\nwrote {plot}")


def feather_prior_options(hardware: str | None, model: str | None) -> dict:
    """`policy_options` giving the real-engine feather a step-cost prior: a fitted hardware
    profile and the built-in engine model's own profile (a model directory has none). The
    rule of `--feather-hardware` is the simulator's (`cost.resolve.prior_hardware`); a real
    engine's run has no hardware profile of its own, so unset is no prior. The options stay
    names (the record keeps them; the engine's `make_policy` resolves them), checked now."""
    from feather_sched.cost.resolve import prior_cost, prior_hardware

    if prior_hardware(hardware, None) is None:
        return {}
    from feather_lab.harness.vllm_engine import ENGINE_SCALES

    name = model or "tiny-llama"
    if name not in ENGINE_SCALES:
        raise typer.BadParameter(
            "a prior needs a built-in --model (its profile is known)",
            param_hint="--feather-hardware",
        )
    try:
        prior_cost(hardware, None, name)  # before the engine starts, not at its first run
    except ValueError as err:
        fail(err)
    prior = {"hardware": hardware, "model": name}
    return {"feather": prior, "feather-hold": prior}
