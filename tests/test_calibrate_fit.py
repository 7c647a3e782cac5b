"""Cost-model calibration: the fit recovers known parameters; the engine workloads fit the
tiny model; `--engine vllm` fails cleanly. No engine needed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from feather_sched.bench.calibrate_fit import fit_profile, mape, predict
from feather_sched.bench.tiny_llama import ENGINE_MODELS
from feather_sched.bench.vllm_calibrate import (
    GRIDS,
    Sample,
    default_compositions,
    median_of_passes,
    split,
)
from feather_sched.bench.vllm_engine import ENGINE_SCALES, VllmBenchSpec, engine_workload
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


@pytest.mark.parametrize(
    ("model", "name"), [(m, w) for m, sc in ENGINE_SCALES.items() for w in sc.workloads]
)
def test_engine_workloads_fit_their_model(model: str, name: str) -> None:
    spec = VllmBenchSpec(model=model).resolved()
    built = ENGINE_MODELS[model]
    requests = engine_workload(name, built.vocab_size, 0, spec.scale)
    assert requests and spec.max_model_len <= built.max_position_embeddings
    for r in requests:
        assert r.prompt_len + r.output_len <= spec.max_model_len
        assert int(r.prompt.min()) >= 4 and int(r.prompt.max()) < built.vocab_size
    # the no-pressure scenario holds the whole workload (shared prompt blocks once)
    bs = spec.block_size
    blocks = {
        r.prompt[: (i + 1) * bs].tobytes() for r in requests for i in range(r.prompt_len // bs)
    }
    tails = sum(-(-(r.prompt_len % bs + r.output_len) // bs) for r in requests)
    assert len(blocks) + tails <= max(sc.num_blocks for sc in spec.scenarios or ())


def test_kv_bound_grid_covers_locality() -> None:
    """Batches 8-64 (32 and 64 included), 1 to >= 16 prefixes, prefixes to the workloads'
    2,048 tokens: what the cache-reuse fit needs."""
    comps = default_compositions(grid=GRIDS["kv-bound"])
    assert {32, 64} <= {c.batch for c in comps} and min(c.batch for c in comps) == 8
    long = [c for c in comps if c.prefix_len == 2048]
    assert {1, 16} <= {c.prefixes for c in long if c.batch == 64}
    assert {"B32-G1-P2048-S16", "B64-G16-P2048-S16"} <= {c.label for c in comps}


def test_bench_spec_resolves_from_the_model_scale() -> None:
    spec = VllmBenchSpec(model="kv-bound").resolved()
    assert spec.workloads == ("paper-32g", "paper-4g", "no-sharing")
    assert [s.name for s in spec.scenarios or ()] == ["kv-pressure", "no-pressure"]
    assert VllmBenchSpec().resolved().max_model_len == 1024
    with pytest.raises(ValueError, match="no engine-sized settings"):
        VllmBenchSpec(model="kv-bound", workloads=["shared-prefix"]).validate()
    with pytest.raises(ValueError, match="neither a built-in engine model"):
        VllmBenchSpec(model="no-such-model").validate()


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
