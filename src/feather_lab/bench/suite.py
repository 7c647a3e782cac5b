"""`feather bench`: run policies x workloads in the simulator, collect comparable rows.

The spec (`BenchSpec`: what runs, checked whole before anything starts) and the run loop;
building and checking the workloads is `bench.prepare`'s (its names re-exported here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from feather_lab.bench.oracle import oracle_sweep
from feather_lab.bench.prepare import MAX_ARRIVAL_SPAN_S as MAX_ARRIVAL_SPAN_S
from feather_lab.bench.prepare import PreparedWorkload as PreparedWorkload
from feather_lab.bench.prepare import build_bench_workload as build_bench_workload
from feather_lab.bench.prepare import check_requests as check_requests
from feather_lab.bench.prepare import fitted_workload as fitted_workload
from feather_lab.bench.prepare import prepare_workloads as prepare_workloads
from feather_lab.bench.prepare import unscaled_workloads as unscaled_workloads
from feather_lab.bench.report import add_relative
from feather_lab.bench.spec import BASELINE as BASELINE
from feather_lab.bench.spec import BOUNDS as BOUNDS
from feather_lab.bench.spec import DEFAULT_HARDWARE as DEFAULT_HARDWARE
from feather_lab.bench.spec import DEFAULT_POLICIES as DEFAULT_POLICIES
from feather_lab.bench.spec import DEFAULT_WORKLOADS as DEFAULT_WORKLOADS
from feather_lab.bench.spec import MAX_KV_BLOCKS as MAX_KV_BLOCKS
from feather_lab.bench.spec import SUITE as SUITE
from feather_lab.bench.spec import UNBOUNDED_KV as UNBOUNDED_KV
from feather_lab.bench.spec import BenchCosts as BenchCosts
from feather_lab.bench.spec import BenchSpec as BenchSpec
from feather_lab.bench.spec import preset_bounds as preset_bounds
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.workloads.presets import build_workload as build_workload
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.base import Policy
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.registry import make_policy


def run_bench(
    spec: BenchSpec,
    on_progress: Callable[[str], None] | None = None,
    on_rows: Callable[[list[dict]], None] | None = None,
    on_sim: Callable[[str, int, int], None] | None = None,
    prepared: dict[str, PreparedWorkload] | None = None,
    rows: list[dict] | None = None,
    costs: BenchCosts | None = None,
) -> list[dict]:
    """Simulate every (workload, policy) pair; one summary row each.

    `on_rows` gets each workload's rows as soon as they are done (with `vs_fcfs`);
    `on_sim(label, finished, total)` reports inside a run; `rows`, when given, is filled
    in place, so a caller keeps the finished rows if the bench is interrupted; `prepared`
    and `costs`, when given, are what the caller already built and checked.
    """
    costs = costs if costs is not None else spec.costs()
    cost = costs.run
    workloads = prepared if prepared is not None else prepare_workloads(spec, cost)
    tick = on_progress or (lambda _label: None)
    rows = rows if rows is not None else []
    shared_feather = None
    if spec.policy_state is not None and "feather" in spec.policies:
        warm = spec.policy_state.is_file()
        shared_feather = FeatherPolicy(
            policy_state=spec.policy_state if warm else None, cost=costs.feather
        )
    steps_file = spec.steps_out.open("w") if spec.steps_out is not None else None
    try:
        for wname, prepared_workload in workloads.items():
            start = len(rows)  # each run's row lands in `rows` as soon as it is done
            _run_workload(
                spec,
                cost,
                wname,
                prepared_workload,
                lambda name: _make_policy(name, costs.feather, shared_feather),
                tick,
                on_sim,
                steps_file,
                rows,
            )
            done = rows[start:]
            add_relative(done, BASELINE)
            if on_rows is not None:
                on_rows(done)
    finally:
        if steps_file is not None:
            steps_file.close()
    if shared_feather is not None and spec.policy_state is not None:
        shared_feather.save(spec.policy_state)
    return rows


def _run_workload(
    spec: BenchSpec,
    cost: StepCostModel,
    wname: str,
    prepared: PreparedWorkload,
    make: Callable[[str], Policy],
    tick: Callable[[str], None],
    on_sim: Callable[[str, int, int], None] | None,
    steps_file: Any,
    rows: list[dict],
) -> None:
    """Every policy on one workload: a row appended to `rows` as each run finishes.
    `make`: a run's policy by name (the bench's one learning feather with `--policy-state`;
    feather's step-cost prior for the policies that take it)."""
    from feather_lab.bench.steplog import StepRecorder

    requests = prepared.requests
    engine = spec.engine_for(prepared.base or wname)
    for pname in spec.policies:
        label = f"{wname} / {pname}"
        progress = None
        if on_sim is not None:
            progress = lambda done, total, label=label: on_sim(label, done, total)  # noqa: E731
        if pname == "oracle":
            result = oracle_sweep(
                requests,
                cost,
                engine,
                on_run=lambda cap, _r, label=label: tick(f"{label} (cap {cap})"),
            )
        else:
            policy = make(pname)
            if steps_file is not None:
                labels = {"workload": wname, "policy": pname}
                policy = StepRecorder(policy, steps_file, labels)
            result = simulate(requests, policy, cost, engine, progress=progress)
            tick(label)
        rows.append(_bench_row(spec, wname, prepared, engine, result.summary(spec.slo)))
    if UNBOUNDED_KV in preset_bounds(prepared.base or wname):
        rows.append(_unbounded_kv_row(spec, cost, wname, prepared, engine))
        tick(f"{wname} / {UNBOUNDED_KV}")


PRIOR_POLICIES = frozenset({"feather-hold"})
"""Besides `feather`, the policies that take its step-cost prior (as on the real engines)."""


def _make_policy(name: str, prior: StepCostModel | None, shared: Policy | None) -> Policy:
    if name == "feather" and shared is not None:
        return shared
    if name == "feather" or name in PRIOR_POLICIES:
        return make_policy(name, cost=prior)
    return make_policy(name)


def _unbounded_kv_row(
    spec: BenchSpec,
    cost: StepCostModel,
    wname: str,
    prepared: PreparedWorkload,
    engine: EngineConfig,
) -> dict:
    bs = engine.block_size
    need = sum(-(-(r.prompt_len + r.output_len) // bs) for r in prepared.requests)
    unbounded = dataclasses.replace(engine, num_kv_blocks=min(MAX_KV_BLOCKS, need + 1))
    result = simulate(prepared.requests, make_policy(BASELINE), cost, unbounded)
    summary = {**result.summary(spec.slo), "policy": UNBOUNDED_KV}
    return _bench_row(spec, wname, prepared, engine, summary)


def _bench_row(
    spec: BenchSpec,
    wname: str,
    prepared: PreparedWorkload,
    engine: EngineConfig,
    summary: dict,
) -> dict:
    """One run's row: its workload, the engine's batch cap, the run's summary, the requests
    dropped as overlong and, in a sweep, the rate."""
    row = {
        "workload": wname,
        "max_num_seqs": engine.max_num_seqs,
        **summary,
        "dropped_overlong": prepared.dropped,
    }
    if prepared.rate is not None:
        row["rate_req_s"] = prepared.rate
    return row
