"""`feather bench` on the simulator, end to end: check, run, print, save.

Everything that can be wrong with the input is found by `SimBench.prepare`, before the
first simulation: options, profiles, every workload (built, context- and KV-checked), the
policy state file, and every output path. `run` prints a heading and the legend, then each
workload's rows as soon as they are done and a closing summary (`bench.summary`); it writes
the JSON record first (a failed plot never loses the rows), and on Ctrl-C keeps the rows
finished so far (record marked `interrupted`, exit status 130).
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feather_lab.bench.columns import legend
from feather_lab.bench.machine import config_provenance
from feather_lab.bench.output import (
    BenchProgress,
    check_output_path,
    check_plot_path,
    columns_for,
    header,
    replacing,
    terminal_width,
    workload_block,
)
from feather_lab.bench.record import require_clean, write_record
from feather_lab.bench.suite import (
    BASELINE,
    BenchCosts,
    BenchSpec,
    PreparedWorkload,
    prepare_workloads,
    run_bench,
    unscaled_workloads,
)
from feather_lab.bench.summary import summary_text
from feather_lab.sim.scheduler_cpu import load_scheduler_cpu
from feather_sched.cost import load_hardware


def hardware_provenance(hardware: str) -> dict[str, str]:
    """What a record says of its hardware profile: how far its numbers are measured."""
    hw = load_hardware(hardware)
    return {"hardware_provenance": hw.provenance, "hardware_provenance_note": hw.provenance_note}


def scheduler_cpu_provenance(spec: BenchSpec) -> dict[str, Any]:
    """What a record says of the scheduler's CPU on its clock: the mode, the overlap rule
    and, for the model, the record it was fitted from."""
    mode = spec.scheduler_cpu
    note = {
        "model": load_scheduler_cpu().provenance,
        "measured": "the policy's own Python CPU as the simulator timed it on this host",
        "off": "not charged",
    }[mode]
    rule = "max(gpu, cpu)" if spec.engine.async_scheduling else "gpu + cpu"
    return {"scheduler_cpu": mode, "scheduler_cpu_rule": rule, "scheduler_cpu_note": note}


def scheduler_cpu_label(spec: BenchSpec) -> str:
    """The heading's words for it (where the model comes from: the record's config)."""
    info = scheduler_cpu_provenance(spec)
    if info["scheduler_cpu"] == "off":
        return "scheduler CPU off the clock"
    source = "fitted model" if info["scheduler_cpu"] == "model" else "timed here"
    return f"scheduler CPU: {source}, step = {info['scheduler_cpu_rule']}"


def provenance_warning(hardware: str) -> str | None:
    """A note for stderr when the profile is not measured (None when it is), 80 columns."""
    hw = load_hardware(hardware)
    if hw.provenance == "measured":
        return None
    why = hw.provenance_note.split(". ")[0] if hw.provenance_note else "no note"
    return textwrap.fill(
        f"note: hardware profile {hw.name!r} is {hw.provenance}, not measured: {why}.", 80
    )


def sim_config(spec: BenchSpec, prepared: dict[str, PreparedWorkload]) -> dict[str, Any]:
    """The sim record's config: the options as given (`max_num_seqs` None when each workload
    keeps its own) and every parameter of every workload as it ran."""
    engine = spec.engine
    asked_seqs = engine.max_num_seqs if "max_num_seqs" in spec.engine_overrides else None
    return {
        **config_provenance(),
        "engine_kind": "sim",
        "hardware": spec.hardware,
        **hardware_provenance(spec.hardware),
        **scheduler_cpu_provenance(spec),
        "model": spec.model,
        "kernel": spec.kernel,
        "seed": spec.seed,
        "drop_overlong": spec.drop_overlong,
        "policies": list(spec.policies),
        "arrival": spec.arrival,
        "rate_scale": spec.rate_scale,
        "limit": spec.limit,
        "slo": {"ttft_s": spec.slo.ttft_s, "tpot_s": spec.slo.tpot_s},
        "rates": list(spec.rates) if spec.rates else None,
        "feather_hardware": spec.feather_hardware,
        "scheduler_sees_output": engine.scheduler_sees_output,
        "engine": {
            "max_num_seqs": asked_seqs,
            "max_num_batched_tokens": engine.max_num_batched_tokens,
            "num_kv_blocks": engine.num_kv_blocks,
        },
        "workloads": {name: p.params for name, p in prepared.items()},
    }


@dataclass
class SimBench:
    spec: BenchSpec
    json_out: Path
    plot: Path
    prepared: dict[str, PreparedWorkload]
    costs: BenchCosts

    @classmethod
    def prepare(cls, spec: BenchSpec, json_out: Path, plot: Path) -> SimBench:
        """Every check; raises ValueError/OSError naming what is wrong and what is valid."""
        spec.validate()
        require_clean()
        check_output_path(json_out, "--json")
        check_plot_path(plot)
        if spec.steps_out is not None:
            check_output_path(spec.steps_out, "--steps-out")
        if spec.policy_state is not None:
            check_output_path(spec.policy_state, "--policy-state")
            if spec.policy_state.is_file() and "feather" in spec.policies:
                from feather_sched.policies.feather import FeatherPolicy

                FeatherPolicy.read_state(spec.policy_state)  # a bad file fails here
        if len({json_out.resolve(), plot.resolve()}) < 2:
            raise ValueError(f"--json and --plot are the same file: {json_out}")
        costs = spec.costs()  # the profiles, feather's prior's too, checked before any run
        status = None
        if sys.stderr.isatty():
            from rich.console import Console

            status = Console(stderr=True).status("building workloads")
            status.start()
        try:
            prepared = prepare_workloads(spec, costs.run)
        finally:
            if status is not None:
                status.stop()
        unscaled = unscaled_workloads(spec, prepared)
        if unscaled:  # some workloads do scale (else prepare_workloads refused): say which not
            print(
                f"note: --rate-scale {spec.rate_scale:g} leaves {', '.join(unscaled)} "
                "unchanged: its requests all arrive at once",
                file=sys.stderr,
                flush=True,
            )
        return cls(spec, json_out, plot, prepared, costs)

    def heading(self, width: int = 80) -> list[str]:
        """What ran, in lines of at most `width` columns: the hardware profile with its
        provenance and the model first, then the settings."""
        s = self.spec
        hw = load_hardware(s.hardware)
        first = f"feather bench, simulated: {hw.name} ({hw.provenance}), model {s.model}"
        extra = [
            f"{k} {v}"
            for k, v in (
                ("arrival", s.arrival),
                ("rate x", s.rate_scale),
                ("limit", s.limit),
                ("SLO ttft", s.slo.ttft_s),
                ("SLO tpot", s.slo.tpot_s),
                ("rates", ",".join(f"{r:g}" for r in s.rates) if s.rates else None),
            )
            if v is not None
        ]
        sees = f"scheduler sees output: {s.engine.scheduler_sees_output}"
        rest = [f"{s.kernel} kernel", f"seed {s.seed}", scheduler_cpu_label(s), sees, *extra]
        return [*textwrap.wrap(first, width), *textwrap.wrap(", ".join(rest), width)]

    def title(self) -> str:
        """The heading in one line (the plot's title)."""
        return ", ".join(self.heading(width=10_000))

    def run(self) -> int:
        """Run, print, save; the exit status (0, 1 if the plot failed, 130 if interrupted)."""
        cols = columns_for(terminal_width())
        rows: list[dict] = []
        interrupted = False
        failure: str | None = None
        warning = provenance_warning(self.spec.hardware)
        if warning is not None:
            print(warning, file=sys.stderr, flush=True)
        replacing(self.spec.steps_out)
        with BenchProgress(self.spec.total_runs()) as progress:
            for line in [*self.heading(), "", *legend(shown=cols).splitlines(), ""]:
                progress.emit(line)
            progress.emit(header(cols))

            def show(done: list[dict]) -> None:
                for line in workload_block(done, cols):
                    progress.emit(line)

            try:
                run_bench(
                    self.spec,
                    on_progress=progress.run_done,
                    on_rows=show,
                    on_sim=progress.inside,
                    prepared=self.prepared,
                    rows=rows,
                    costs=self.costs,
                )
            except KeyboardInterrupt:
                interrupted = True
            except Exception as err:  # keep what finished; say what broke
                failure = f"{type(err).__name__}: {err}"
        summary = summary_text(rows, BASELINE)
        if summary:
            print(f"\n{summary}\n", flush=True)
        return self.save(rows, interrupted, failure)

    def save(self, rows: list[dict], interrupted: bool, failure: str | None = None) -> int:
        from feather_lab.bench.report import add_relative

        if interrupted or failure is not None:
            add_relative(rows, BASELINE)  # the unfinished workload's rows too
        config = sim_config(self.spec, self.prepared)
        if interrupted:
            config["interrupted"] = True
        if failure is not None:
            config["failed"] = failure
        replacing(self.json_out)
        write_record(self.json_out, config=config, rows=rows)
        if failure is not None:
            print(
                f"error: the bench stopped ({failure}); {len(rows)} finished rows saved "
                f"to {self.json_out}",
                file=sys.stderr,
                flush=True,
            )
            return 1
        if interrupted:
            print(
                f"interrupted: {len(rows)} finished rows saved to {self.json_out}",
                file=sys.stderr,
                flush=True,
            )
            return 130
        if not rows:
            return 0
        from feather_lab.bench import report

        replacing(self.plot)
        try:
            if self.spec.rates:
                report.plot_sweep(rows, self.plot, self.title())
            else:
                report.plot_results(rows, self.plot, self.title())
        except Exception as err:  # the rows are saved; only the plot is lost
            print(
                f"error: rows saved to {self.json_out}, but the plot {self.plot} failed: {err}",
                file=sys.stderr,
                flush=True,
            )
            return 1
        for path in (self.json_out, self.plot, self.spec.steps_out):
            if path is not None:
                print(f"wrote {path}", flush=True)
        return 0
