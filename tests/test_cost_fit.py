"""Cost-model calibration: the fit recovers known parameters; the engine workloads fit the
tiny model; `--engine vllm` fails cleanly. No engine needed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from feather_lab.cli import app
from feather_lab.harness import vllm_calibrate, vllm_calibrate_fit
from feather_lab.harness.tiny_llama import ENGINE_MODELS
from feather_lab.harness.vllm_calibrate_grid import GRIDS, default_compositions
from feather_lab.harness.vllm_calibrate_samples import Sample, median_of_passes, split
from feather_lab.harness.vllm_calibrate_spec import COMPARE_POLICIES, CalibrateSpec
from feather_lab.harness.vllm_engine import ENGINE_SCALES, VllmBenchSpec, engine_workload
from feather_sched.cost import BatchShape, load_hardware, load_model
from feather_sched.cost.fit import fit_profile, mape, predict


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


def _engine_free_calibration(monkeypatch: pytest.MonkeyPatch) -> list[Sample]:
    """Stand-ins for the engine parts of `run_calibration`: samples from a known profile
    (decode 10% slower, prefill 10% faster than it) and two real rows with their steps."""
    model = load_model("tiny-llama")
    truth = load_hardware("cpu").replace(bandwidth_efficiency=0.3, step_overhead_s=0.0015)
    samples = []
    for b in (1, 4, 16):
        for p in (128, 512):
            label = f"B{b}-P{p}"
            decode = BatchShape.shared_prefix_decode([b], p, 16)
            prefill = BatchShape(num_prefill_tokens=p * b, prefill_attn_pairs=p * (p + 1) // 2 * b,
                                 logical_kv_tokens=p * b, unique_kv_tokens=p * b,
                                 num_prefill_seqs=b)  # fmt: skip
            for kind, shape, scale in (("decode", decode, 1.1), ("prefill", prefill, 0.9)):
                seconds = float(predict(truth, model, [shape])[0]) * scale
                samples.append(Sample(label, kind, shape, seconds))
    row = {"workload": "no-sharing (kv-pressure)", "output_tok_s": 900.0, "mean_batch": 5.0}
    row |= {"steps": 40, "busy_s": 0.5, "kv_blocks": 96, "scenario": "kv-pressure"}
    steps = [BatchShape.shared_prefix_decode([4], 512, 16)] * 40
    runs = [{**row, "policy": p, "step_shapes": steps} for p in ("vllm", "grouped")]
    monkeypatch.setattr(vllm_calibrate, "require_vllm", lambda: None)
    monkeypatch.setattr(vllm_calibrate, "engine_env_defaults", lambda: None)
    monkeypatch.setattr(vllm_calibrate, "model_dir", lambda spec, cache=None: ("m", "auto", 512))
    monkeypatch.setattr(vllm_calibrate, "_measure", lambda *args: (samples, runs))
    monkeypatch.setattr(vllm_calibrate_fit, "_vllm_version", lambda: "0.0")
    return samples


def test_run_calibration_fits_saves_and_compares(tmp_path, monkeypatch) -> None:
    """The calibration's own logic with the engine replaced: the fit on the training
    compositions, errors on the held-out ones, the saved profile, the replayed comparison."""
    samples = _engine_free_calibration(monkeypatch)
    bench = VllmBenchSpec(workloads=("no-sharing",), policies=("grouped",))
    spec = CalibrateSpec(bench=bench, holdout_every=3, passes=1, quick=True)
    ticks: list[str] = []
    report = vllm_calibrate.run_calibration(spec, tmp_path / "hw.json", on_progress=ticks.append)
    assert list(report) == [
        "profile_path", "profile", "train_mape", "heldout_mape", "heldout_mape_by_kind",
        "samples", "heldout", "decode", "end_to_end", "spec",
    ]  # fmt: skip
    assert ticks == ["fitting 8 samples", "end-to-end comparison"]
    assert {h["composition"] for h in report["heldout"]} == {"B4-P128", "B16-P512"}
    assert report["samples"] == {"train": 8, "heldout": 4}
    assert set(report["heldout_mape_by_kind"]) == {"decode", "prefill"}
    assert report["train_mape"] < 0.2 and report["heldout_mape"] < 0.2
    assert len(report["decode"]) == 6 and sum(d["heldout"] for d in report["decode"]) == 2
    saved = load_hardware(tmp_path / "hw.json")
    assert saved.name == report["profile"]["name"] == "cpu-vllm-fitted"
    assert "model tiny-llama, 8 step samples" in saved.description
    vllm_row, grouped_row = report["end_to_end"]
    assert (vllm_row["policy"], grouped_row["policy"]) == ("vllm", "grouped")
    assert vllm_row["real_tok_s"] == 900.0 and vllm_row["sim_tok_s"] > 0
    assert vllm_row["replay_over_busy"] > 0  # the fitted model priced the run's own steps
    assert report["spec"] == {
        "model": None, "base_hardware": "cpu", "model_profile": None, "block_size": 32,
        "max_model_len": None, "max_num_batched_tokens": 4096, "kv_blocks": None,
        "holdout_every": 3, "repeats": 1, "quick": True, "seed": 0,
        "compare_workloads": ("no-sharing",), "compare_policies": ("grouped",),
        "compare_scenarios": None, "compare_repeats": 3, "policy_options": {},
    }  # fmt: skip
    assert len(samples) == 12


def test_run_calibration_compares_given_rows_and_needs_a_profile_for_a_directory(
    tmp_path, monkeypatch
) -> None:
    _engine_free_calibration(monkeypatch)
    given = [{"workload": "no-sharing (kv-pressure)", "policy": "vllm", "scenario": "kv-pressure",
              "kv_blocks": 96, "output_tok_s": 700.0}]  # fmt: skip
    bench = VllmBenchSpec(workloads=("no-sharing",), policies=("grouped",))
    spec = CalibrateSpec(bench=bench, passes=1, bench_rows=given)
    report = vllm_calibrate.run_calibration(spec, tmp_path / "hw.json")
    ((row,),) = [report["end_to_end"]]
    assert row["real_tok_s"] == 700.0 and row["replay_over_busy"] is None
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="needs --model-profile"):
        vllm_calibrate.run_calibration(
            CalibrateSpec(bench=VllmBenchSpec(model=str(model))), tmp_path / "x.json"
        )
    assert CalibrateSpec().bench.policies == COMPARE_POLICIES
