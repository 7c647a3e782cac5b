"""`feather vllm-bench` (harness/vllm_bench.py) on the real vLLM engine, run tiny: the record's
structure and every request accounted for (its timings are recorded, never asserted)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from requires import require

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is not None:  # before torch loads (see test_vllm_integration)
    for _key, _value in {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}.items():
        os.environ.setdefault(_key, _value)

require("vllm", "vllm", "needs the real vLLM engine: pip install -e '.[vllm]' (see pyproject)")

from feather_lab.harness.vllm_bench import run_vllm_pass  # noqa: E402
from feather_lab.harness.vllm_bench_probe import HOOKS  # noqa: E402
from feather_lab.harness.vllm_bench_spec import VllmPassSpec  # noqa: E402

N = 50
SPEC = VllmPassSpec(
    sizes=(N,), repeats=2, steps=4, warmup=1, kv_blocks=256, groups=4, output_len=2
)  # 2 output tokens: requests finish within the run's 5 steps


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    labels: list[str] = []
    out = run_vllm_pass(SPEC, on_progress=labels.append, cache=tmp_path_factory.mktemp("m"))
    assert labels == [f"{e}/n{N}/r{r}" for r in range(2) for e in ("vllm", "feather")]
    return out


def test_every_request_is_accounted_for(rows: list[dict]) -> None:
    (row,) = rows
    for engine, runs in row["runs"].items():
        assert len(runs) == SPEC.repeats, engine
        for run in runs:
            left = run["aborted_waiting"] + run["aborted_running"]
            assert run["added"] == run["finished"] + left, (engine, run)
            # the queue was held at N (more only if vLLM preempted into it after the top-up)
            assert run["aborted_waiting"] >= N and run["added"] >= N
            # short outputs over 5 steps: some finished, which is what topped the queue up
            assert run["finished"] > 0 and run["added"] > N


def test_record_structure(rows: list[dict]) -> None:
    (row,) = rows
    assert row["n_waiting"] == N
    for key in ("vllm_schedule_us", "feather_schedule_us", "feather_part_us"):
        assert row[key] > 0 and row[f"{key}_min"] <= row[key] <= row[f"{key}_max"]
    assert row["feather_part_us"] < row["feather_schedule_us"]
    assert row["feather_part_vs_vllm"] == row["feather_part_us"] / row["vllm_schedule_us"]
    assert row["feather_part_mean_vs_vllm"] == (
        row["feather_part_mean_us"] / row["vllm_schedule_mean_us"]
    )
    assert row["feather_added_us"] == row["feather_schedule_us"] - row["vllm_schedule_us"]
    assert set(row["feather_hooks_us_per_step"]) <= {*HOOKS, "_prefill_tokens"}
    assert {"has_next", "pop", "begin_schedule", "end_schedule"} <= set(
        row["feather_hooks_us_per_step"]
    )
    assert row["feather_policy_us"] >= 0 and row["feather_host_us"] > 0
    assert row["feather_resyncs"] == 0 and row["feather_policy_errors"] == 0
    assert row["vllm_add_request_us"] > 0 and row["feather_in_add_request_us"] > 0


def test_bad_spec_is_refused_before_any_engine() -> None:
    with pytest.raises(ValueError, match="--kv-blocks 1 x 32 tokens cannot hold"):
        run_vllm_pass(VllmPassSpec(kv_blocks=1))
    with pytest.raises(ValueError, match="--policy 'nope' is not a policy"):
        run_vllm_pass(VllmPassSpec(policy="nope"))
