"""Pieces of the real-engine bench that need no engine: the step probe on a stand-in
scheduler, and the relative-throughput columns."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from feather_lab.bench.report import add_relative
from feather_lab.harness.vllm_steps import StepProbe


class _Scheduler:
    """Just the two methods the probe wraps; `outputs` are what `schedule` returns."""

    def __init__(self, outputs: list[dict[str, int]]) -> None:
        self.outputs = outputs

    def schedule(self) -> SimpleNamespace:
        return SimpleNamespace(num_scheduled_tokens=self.outputs.pop(0))

    def _preempt_request(self, request: SimpleNamespace, timestamp: float) -> str:
        return f"preempted {request.request_id}"


def test_step_probe_counts_steps_groups_and_preemptions_then_unwraps() -> None:
    sched = _Scheduler([{"a": 5, "b": 1, "c": 1}, {}, {"a": 1}])
    group = {"a": "g1", "b": "g1", "c": "g2"}
    with StepProbe(sched, group.get) as probe:
        sched.schedule()
        sched.schedule()  # nothing scheduled: not a step
        victim = SimpleNamespace(request_id="a", num_computed_tokens=40)
        assert sched._preempt_request(victim, 0.0) == "preempted a"  # still the real one
        sched.schedule()
    assert (probe.steps, probe.batch, probe.groups) == (2, 4, 3)
    assert probe.preempted == {"a": 1} and probe.preempted_kv_tokens == 40
    assert probe.sched_s >= 0.0 and probe.shapes is None
    assert "schedule" not in vars(sched) and "_preempt_request" not in vars(sched)


def test_step_probe_without_groups_counts_no_groups() -> None:
    sched = _Scheduler([{"a": 1, "b": 1}])
    with StepProbe(sched) as probe:
        sched.schedule()
    assert (probe.steps, probe.batch, probe.groups) == (1, 2, 0)


def test_add_relative_divides_by_the_baseline_of_the_same_workload() -> None:
    rows = [
        {"workload": "w1", "policy": "vllm", "output_tok_s": 100.0, "output_tok_cpu_s": 50.0},
        {"workload": "w1", "policy": "grouped", "output_tok_s": 150.0, "output_tok_cpu_s": 40.0},
        {"workload": "w2", "policy": "grouped", "output_tok_s": 80.0, "output_tok_cpu_s": 8.0},
        {"workload": "w3", "policy": "vllm", "output_tok_s": 0.0, "output_tok_cpu_s": 1.0},
    ]
    add_relative(rows, "vllm", (("output_tok_s", "vs_fcfs"), ("output_tok_cpu_s", "cpu")))
    assert [r["vs_fcfs"] for r in rows] == [1.0, 1.5, None, None]  # no / zero baseline: None
    assert [r["cpu"] for r in rows] == [1.0, 0.8, None, 1.0]
    add_relative(rows, "grouped")  # default column: vs_fcfs from output_tok_s
    assert rows[0]["vs_fcfs"] == pytest.approx(0.667) and rows[2]["vs_fcfs"] == 1.0
