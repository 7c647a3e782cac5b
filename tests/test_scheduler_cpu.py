"""The scheduler's CPU on the simulated clock: the cost model's fit against its
record, the engine's overlap rule, the bench option, and `off`: nothing charged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from feather_lab.bench.suite import BenchSpec, build_workload
from feather_lab.cli import app
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.sim.result import TIMING_KEYS
from feather_lab.sim.sched_cpu import SchedCpuClock
from feather_lab.sim.scheduler_cpu import (
    CpuRow,
    build,
    fit_error,
    fit_line,
    load_scheduler_cpu,
)
from feather_sched.cost import StepCostModel
from feather_sched.policies.fcfs import FCFSPolicy
from feather_sched.policies.registry import make_policy

ROOT = Path(__file__).resolve().parent.parent
MODEL = load_scheduler_cpu()
RECORD = json.loads((ROOT / MODEL.record).read_text())["results"]
POINTS_FILE = ROOT / "src/feather_lab/sim/scheduler_cpu.json"


def _series(field: str) -> dict[int, float]:
    return {r["n_waiting"]: r[field] for r in RECORD}


def _line(field: str) -> tuple[float, float]:
    """The two-point line through the record's series, in seconds (as the rows keep it)."""
    (x1, y1), (x2, y2) = sorted(_series(field).items())
    slope = (y2 - y1) / (x2 - x1)
    return (y1 - slope * x1) * 1e-3, slope * 1e-3


FEATHER = json.loads(POINTS_FILE.read_text())["feather_policy"]
FEATHER_RECORD = json.loads((ROOT / FEATHER["record"]).read_text())


def test_the_packaged_points_are_the_records() -> None:
    points = json.loads(POINTS_FILE.read_text())["points"]
    for field, by_size in points.items():
        assert {int(n): v for n, v in by_size.items()} == _series(field), field
    # the feather policy's section: its own record, beside the running batch it names
    assert FEATHER_RECORD["feather_policy"] == "feather"
    assert (FEATHER_RECORD["running"], FEATHER_RECORD["max_running"]) == (
        FEATHER["running"],
        FEATHER["max_running"],
    )
    assert FEATHER_RECORD.get("finished", 0) == FEATHER.get("finished", 0)
    assert FEATHER_RECORD["feather_policy_options"] == FEATHER["policy_options"]
    for field, by_size in FEATHER["points"].items():
        own = {r["n_waiting"]: r[field] for r in FEATHER_RECORD["results"]}
        assert {int(n): v for n, v in by_size.items()} == own, field


@pytest.mark.parametrize(
    "family, field",
    [("dfs-weight", "dfs-weight_calc_priority_ms"), ("fcfs", "fcfs_calc_priority_ms")],
)
def test_measured_rows_are_the_lines_through_their_record(family: str, field: str) -> None:
    b, m = fit_line(_series(field))
    row = MODEL.rows[family]
    assert row.provenance == "measured" and field in row.note
    assert row.per_pass_s == pytest.approx(b * 1e-3) and row.per_waiting_s == pytest.approx(
        m * 1e-3
    )
    exact = _line(field)
    if min(exact) >= 0:  # nothing to clamp: the line passes through both points
        assert (row.per_pass_s, row.per_waiting_s) == pytest.approx(exact)
    else:  # a negative fixed cost or slope is noise, clamped to 0; the note says how far off
        assert min(row.per_pass_s, row.per_waiting_s) == 0
        assert f"fit error {fit_error(_series(field), b, m):.1%}" in row.note


def test_lpm_matches_up_to_128_waiting_then_prices_sglangs_fallback() -> None:
    lpm = MODEL.rows["lpm"]
    intercept, slope = fit_line(_series("lpm_matching_calc_priority_ms"))
    assert lpm.per_waiting_s == pytest.approx(slope * 1e-3)
    assert lpm.pass_s(128, 0) == pytest.approx((intercept + 128 * slope) * 1e-3)
    fb, fm = fit_line(_series("lpm_calc_priority_ms"))  # SGLang's fallback to fcfs
    assert lpm.pass_s(129, 0) == pytest.approx((fb + 129 * fm) * 1e-3)
    assert MODEL.rows["dfs-weight"].pass_s(10_000, 0) > 100 * lpm.pass_s(10_000, 0)


def test_admission_and_feather_rows_come_from_the_formation_records() -> None:
    per_admit = [
        (r["lpm_batch_formation_ms"] - r["lpm_calc_priority_ms"]) / r["lpm_admitted"]
        for r in RECORD
    ]
    mean = sum(per_admit) / 2
    assert MODEL.rows["fcfs"].per_admission_s == pytest.approx(mean * 1e-3)
    host = MODEL.rows["feather-host"]
    for r, own in zip(RECORD, per_admit):  # Feather's formation = its pass + SGLang's adder
        formation = host.pass_s(r["n_waiting"], r["feather_admitted"]) * 1e3
        # exact but for the adder's cost, one mean over both sizes, not this size's own
        off_by = abs(own - mean) * r["feather_admitted"]
        assert abs(formation - r["feather_batch_formation_ms"]) <= off_by + 1e-9


def test_the_feather_row_is_its_own_formation_less_sglangs_adder() -> None:
    """feather's pass: its formation beside a running batch less SGLang's adder work for what
    it admitted, at that record's adder cost; the authors' policies borrow it (estimates)."""
    feather = MODEL.rows["feather"]
    assert feather.provenance == "measured" and FEATHER["record"] in feather.note
    own = {}
    for r in FEATHER_RECORD["results"]:
        adder = (r["lpm_batch_formation_ms"] - r["lpm_calc_priority_ms"]) / r["lpm_admitted"]
        own[r["n_waiting"]] = r["feather_batch_formation_ms"] - adder * r["feather_admitted"]
    b, m = fit_line(own)
    assert (feather.per_pass_s, feather.per_waiting_s) == pytest.approx((b * 1e-3, m * 1e-3))
    assert f"fit error {fit_error(own, b, m):.1%}" in feather.note
    assert feather.per_admission_s == MODEL.rows["feather-host"].per_admission_s
    for name in ("feather-paper", "feather-upstream", "feather-ppo"):
        row = MODEL.for_policy(name)
        assert row.provenance == "estimate" and row.per_pass_s == feather.per_pass_s
    assert MODEL.for_policy("feather-hold") is feather


def test_a_different_record_gives_different_coefficients() -> None:
    data = json.loads(POINTS_FILE.read_text())
    data["points"]["dfs-weight_calc_priority_ms"]["10000"] *= 2
    assert (
        build(data).rows["dfs-weight"].per_waiting_s > 1.9 * MODEL.rows["dfs-weight"].per_waiting_s
    )


def test_fit_line_clamps_noise_to_zero() -> None:
    assert fit_line({1000: 2.0, 10000: 1.0}) == (1.5, 0.0)
    assert fit_line({1000: 1.0, 10000: 19.0}) == (0.0, pytest.approx(0.002))
    with pytest.raises(ValueError, match="two queue lengths"):
        fit_line({1000: 1.0})


def test_every_policy_has_a_row_or_a_clear_error() -> None:
    from feather_sched.policies.registry import policy_names

    for name in policy_names():
        assert MODEL.for_policy(name).per_admission_s > 0
    with pytest.raises(ValueError, match=r"no CPU row for policy 'mine'.*measured or off"):
        MODEL.for_policy("mine")


def test_the_overlap_rule_async_takes_the_longer_sync_adds() -> None:
    row = CpuRow("t", per_pass_s=0.030, per_waiting_s=0.0, per_admission_s=0.001)
    for gpu, want_async in ((0.010, 0.032), (0.050, 0.050)):
        on, off = SchedCpuClock("model", row, True), SchedCpuClock("model", row, False)
        for clock in (on, off):
            clock.passed(0.0, waiting=5, admitted=2)
        assert on.step(gpu) == pytest.approx(want_async)
        assert off.step(gpu) == pytest.approx(gpu + 0.032)
        assert on.step(gpu) == gpu  # charged once: the next step has no pass


def _tiny(config: EngineConfig):
    requests = build_workload("shared-prefix").generate(0)[:40]
    return simulate(requests, FCFSPolicy(), StepCostModel("h200", "llama-3.1-8b"), config)


def test_on_a_tiny_run_sync_adds_the_cpu_and_async_hides_it_under_the_step() -> None:
    off = _tiny(EngineConfig(scheduler_cpu="off"))
    sync = _tiny(EngineConfig(scheduler_cpu="model", async_scheduling=False))
    hidden = _tiny(EngineConfig(scheduler_cpu="model", async_scheduling=True))
    # fcfs decides the same whatever the clock: the same steps, only their lengths differ
    assert off.num_steps == sync.num_steps == hidden.num_steps
    cpu_s = sync.extra["sched_cpu_ms_per_step"] * sync.num_steps * 1e-3
    assert cpu_s > 0
    gpu = off.steps["duration"]
    assert sync.steps["duration"].sum() == pytest.approx(gpu.sum() + cpu_s)
    assert (sync.steps["duration"] >= gpu).all()
    # every step's GPU time here outlasts its few admissions' CPU: nothing shows
    assert hidden.extra["sched_cpu_bound_steps"] == 0
    assert list(hidden.steps["duration"]) == list(gpu)
    # the same CPU over less time: a larger share of the shorter steps
    assert 0 < sync.extra["sched_cpu_share"] < hidden.extra["sched_cpu_share"]


def test_off_reproduces_the_recorded_behaviour_check() -> None:
    """A few cells of benchmarks/sim/sim_check.py, off, against its record (the whole check:
    `python benchmarks/sim/sim_check.py OUT --against benchmarks/sim/check.json`)."""
    before = json.loads((ROOT / "benchmarks/sim/check.json").read_text())["runs"]
    cost = StepCostModel("h100", "llama-3.1-8b")
    for workload, kv, policy in (("tree", 3000, "dfs-weight"), ("paper-5g", None, "feather")):
        options = {"hardware": "h100", "model": "llama-3.1-8b"} if policy == "feather" else {}
        engine = EngineConfig(num_kv_blocks=kv, scheduler_cpu="off", scheduler_sees_output="exact")
        requests = build_workload(workload).generate(0)
        s = simulate(requests, make_policy(policy, **options), cost, engine).summary()
        keep = {k: v for k, v in s.items() if k not in TIMING_KEYS}
        assert keep == before[f"{workload}/{kv}/{policy}"]
        assert "sched_cpu_share" not in s


def test_engine_config_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="valid: model, measured, off"):
        EngineConfig(scheduler_cpu="maybe")


def test_the_bench_charges_the_model_by_default_and_says_so(tmp_path: Path) -> None:
    assert BenchSpec().scheduler_cpu == "model"
    out = tmp_path / "o.json"
    args = ["bench", "-w", "shared-prefix", "--limit", "48", "--policies", "fcfs,dfs-weight"]
    result = CliRunner().invoke(app, [*args, "--json", str(out), "--plot", str(tmp_path / "p.png")])
    assert result.exit_code == 0, result.output
    assert "scheduler CPU: fitted model, step = max(gpu, cpu)" in result.output
    record = json.loads(out.read_text())
    assert MODEL.record in record["config"]["scheduler_cpu_note"]  # where it was fitted
    assert record["config"]["scheduler_cpu"] == "model"
    assert record["config"]["scheduler_cpu_rule"] == "max(gpu, cpu)"
    shares = {r["policy"]: r["sched_cpu_share"] for r in record["rows"]}
    assert 0 < shares["fcfs"] < shares["dfs-weight"] < 1


def test_measured_charges_the_policys_timed_python() -> None:
    """`measured` charges what the host timed (so only its sign is checked here), sync adds
    it; the model's rows play no part."""
    clock = SchedCpuClock.for_run("measured", "no-such-policy", async_scheduling=False)
    assert clock is not None and clock.row is None
    clock.passed(0.004, waiting=10_000, admitted=3)
    assert clock.step(0.010) == pytest.approx(0.014)
    result = _tiny(EngineConfig(scheduler_cpu="measured", async_scheduling=False))
    assert result.extra["sched_cpu_ms_per_step"] > 0
    assert SchedCpuClock.for_run("off", "no-such-policy", True) is None
