"""Cost-model calibration: the fit recovers known parameters; the engine workloads fit the
tiny model; `--engine vllm` fails cleanly. No engine needed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from feather_sched.bench.calibrate_fit import fit_profile, mape, predict
from feather_sched.bench.tiny_llama import TINY_LLAMA
from feather_sched.bench.vllm_calibrate import Sample, default_compositions, median_of_passes, split
from feather_sched.bench.vllm_engine import TINY_WORKLOADS, VllmBenchSpec, engine_workload
from feather_sched.cli import app
from feather_sched.sim.cost import BatchShape, load_hardware, load_model


def _shapes() -> list[BatchShape]:
    out = []
    for b in (1, 4, 16, 64):
        for g in sorted({1, max(1, b // 8), b}):
            sizes = [b // g + (1 if i < b % g else 0) for i in range(g)]
            for p in (128, 896):
                out.append(BatchShape.shared_prefix_decode(sizes, p, 32))
        out.append(BatchShape(num_prefill_tokens=256 * b, prefill_attn_pairs=256 * 257 // 2 * b,
                              logical_kv_tokens=256 * b, unique_kv_tokens=256 * b,
                              num_prefill_seqs=b))  # fmt: skip
    return out


def test_fit_recovers_a_known_profile() -> None:
    model = load_model("tiny-llama")
    truth = load_hardware("cpu").replace(
        bandwidth_efficiency=0.3,
        compute_efficiency=0.2,
        cache_efficiency=0.05,
        reuse_exponent=1.0,
        step_overhead_s=0.0015,
        per_seq_overhead_s=5e-5,
    )
    shapes = _shapes()
    seconds = predict(truth, model, shapes)
    fit = fit_profile(load_hardware("cpu"), model, shapes, seconds)
    assert fit.train_mape < 0.03
    assert mape(predict(fit.profile, model, shapes), seconds) == pytest.approx(fit.train_mape)
    assert fit.profile.step_overhead_s == pytest.approx(0.0015, rel=0.2)


def test_fit_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        fit_profile(load_hardware("cpu"), load_model("tiny-llama"), _shapes()[:2], [0.1, 0.1])


def test_split_holds_out_whole_compositions_and_medians_over_passes() -> None:
    shape = BatchShape(num_decode=1, logical_kv_tokens=10, unique_kv_tokens=10)
    passes = [
        [Sample(f"c{i}", k, shape, t) for i in range(8) for k in ("prefill", "decode")]
        for t in (1.0, 3.0, 2.0)
    ]
    merged = median_of_passes(passes)
    assert len(merged) == 16 and {s.seconds for s in merged} == {2.0}
    train, held = split(merged, 4)
    assert {s.composition for s in held} == {"c3", "c7"}
    assert not {s.composition for s in train} & {"c3", "c7"}


def test_default_compositions_fit_the_tiny_model() -> None:
    for comp in default_compositions():
        assert comp.prefix_len + comp.suffix_len + comp.decode_steps + 1 <= 1024
        assert 1 <= comp.prefixes <= comp.batch
    assert len(default_compositions(quick=True)) < len(default_compositions())


@pytest.mark.parametrize("name", list(TINY_WORKLOADS))
def test_engine_workloads_fit_the_tiny_model(name: str) -> None:
    spec = VllmBenchSpec()
    requests = engine_workload(name, TINY_LLAMA.vocab_size, seed=0)
    assert requests
    for r in requests:
        assert r.prompt_len + r.output_len <= spec.max_model_len
        assert int(r.prompt.min()) >= 4 and int(r.prompt.max()) < TINY_LLAMA.vocab_size


def test_bench_engine_vllm_rejects_unsized_workloads_and_bad_engines() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["bench", "--engine", "vllm", "-w", "trace:x.jsonl"])
    assert result.exit_code == 2 and "engine-sized" in result.output
    result = runner.invoke(app, ["bench", "--engine", "vllm", "--policies", "oracle"])
    assert result.exit_code == 2 and "unknown policies" in result.output
    result = runner.invoke(app, ["bench", "--engine", "gpu"])
    assert result.exit_code != 0
    result = runner.invoke(app, ["calibrate", "--engine", "sglang"])
    assert result.exit_code != 0
