"""`feather calibrate` (the cost model fitted on a real engine) and `feather probe` (fitted on
real kernels, no engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from feather_lab.bench.record import write_record
from feather_lab.cli.bench import feather_prior_options
from feather_lab.cli.common import (
    app,
    console,
    fail,
    writable,
)
from feather_lab.cli.options import (
    BaseHardware,
    BenchJsonIn,
    CalibrateFeatherHardware,
    CalibrateModel,
    GridPasses,
    ModelProfile,
    Seed,
)
from feather_lab.harness.vllm_engine import VllmBenchSpec


@app.command("calibrate")
def calibrate(
    engine: Annotated[str, typer.Option(help="Engine to measure (vllm).")] = "vllm",
    model: CalibrateModel = None,
    model_profile: ModelProfile = None,
    base_hardware: BaseHardware = "cpu",
    out: Annotated[Path, typer.Option(help="Fitted hardware profile.")] = Path(
        "feather-hw-fitted.json"
    ),
    json_out: Annotated[Path, typer.Option("--json", help="Report.")] = Path(
        "feather-calibrate.json"
    ),
    bench_json: BenchJsonIn = None,
    holdout_every: Annotated[int, typer.Option(min=2, help="Hold out every N-th composition.")] = 4,
    repeats: GridPasses = 5,
    quick: Annotated[
        bool, typer.Option(help="A small grid of compositions (a smoke run).")
    ] = False,
    seed: Seed = 0,
    feather_hardware: CalibrateFeatherHardware = None,
) -> None:
    """Measure real step times, fit the cost model's hardware parameters, report its error."""
    from feather_lab.harness.vllm_calibrate import run_calibration
    from feather_lab.harness.vllm_calibrate_spec import COMPARE_POLICIES, CalibrateSpec

    if engine != "vllm":
        raise typer.BadParameter(
            f"only vllm can be calibrated, got {engine!r}", param_hint="--engine"
        )
    writable(out=out, json=json_out)
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
        fail(err)
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
    profile, report held-out MAPE (feather_lab.probe; benchmarks/gpu/run.sh on a GPU)."""
    from feather_lab.probe.run import run_probe
    from feather_lab.probe.spec import ProbeSpec
    from feather_lab.probe.summary import summary_lines

    writable(out=out, json=json_out, plot=plot)
    spec = ProbeSpec(device=device, model=model, quick=quick, base_hardware=base_hardware)
    try:
        report = run_probe(spec, out, json_out, plot, log=lambda s: console.print(escape(s)))
    except (ValueError, RuntimeError, ImportError) as err:
        fail(err)
    for line in summary_lines(report):
        console.print(escape(line))
    console.print(f"wrote {out}, {json_out}" + (f", {plot}" if report.get("plot") else ""))
