"""Tests for the simulator's cost model: profiles (data) and the step-time model."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather_sched.cost import (
    BatchShape,
    HardwareProfile,
    KernelMode,
    ModelProfile,
    ProfileError,
    StepCostModel,
    list_hardware,
    list_models,
    load_hardware,
    load_model,
)

MS = 1e-3


@pytest.fixture(scope="module")
def h100() -> HardwareProfile:
    return load_hardware("h100-free-l2")


@pytest.fixture(scope="module")
def llama() -> ModelProfile:
    return load_model("llama-3-8b")


@pytest.fixture(scope="module")
def paged(h100, llama) -> StepCostModel:
    return StepCostModel(h100, llama, KernelMode.PAGED)


@pytest.fixture(scope="module")
def ideal(h100, llama) -> StepCostModel:
    return StepCostModel(h100, llama, KernelMode.IDEAL)


# --------------------------------------------------------------------------- profiles


def test_builtin_names():
    assert list_hardware() == ["a100", "cpu", "h100", "h100-free-l2", "h200", "rtx6000-ada"]
    assert list_models() == [
        "kv-bound",
        "llama-3-8b",
        "llama-3.1-8b",
        "longchat-13b",
        "qwen2.5-0.5b",
        "qwen2.5-1.5b",
        "qwen2.5-7b",
        "tiny-llama",
    ]
    assert load_hardware("H100") is load_hardware("h100")  # case-insensitive, cached


def test_llama3_8b_derived_numbers(llama):
    assert llama.kv_bytes_per_token == 128 * 1024
    assert llama.kv_bytes_per_token_per_layer == 4 * 1024
    assert llama.num_params == pytest.approx(8.03e9, rel=0.005)
    assert llama.weight_bytes == pytest.approx(16.06e9, rel=0.005)
    # Untied input embedding (128256 x 4096 bf16, 1.05 GB) is gathered, not streamed.
    assert llama.weight_bytes - llama.weight_bytes_per_step == 128256 * 4096 * 2
    assert llama.flops_per_token == pytest.approx(2 * 7.505e9, rel=0.001)
    assert llama.attn_flops_per_pair == 4 * 32 * 32 * 128


@pytest.mark.parametrize(
    ("name", "params", "kv_per_token"),
    [
        # Parameter counts from the model cards; KV = 2 * layers * kv_heads * head_dim * 2.
        ("llama-3-8b", 8.03e9, 2 * 32 * 8 * 128 * 2),
        ("llama-3.1-8b", 8.03e9, 2 * 32 * 8 * 128 * 2),
        ("qwen2.5-0.5b", 0.49e9, 2 * 24 * 2 * 64 * 2),
        ("qwen2.5-1.5b", 1.54e9, 2 * 28 * 2 * 128 * 2),
        ("qwen2.5-7b", 7.61e9, 2 * 28 * 4 * 128 * 2),
        ("longchat-13b", 13.0e9, 2 * 40 * 40 * 128 * 2),
    ],
)
def test_model_params_match_model_cards(name, params, kv_per_token):
    m = load_model(name)
    assert m.num_params == pytest.approx(params, rel=0.01)
    assert m.kv_bytes_per_token == kv_per_token


def test_tiny_llama_matches_test_model_definition():
    m = load_model("tiny-llama")
    # head_dim 32: the smallest head size vLLM's CPU attention supports
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim) == (
        2,
        128,
        4,
        2,
        32,
    )
    assert (m.intermediate_size, m.vocab_size, m.dtype_bytes) == (256, 512, 4)
    assert m.kv_bytes_per_token == 2 * 2 * 2 * 32 * 4


def test_hardware_datasheet_numbers():
    h100, h200, a100 = load_hardware("h100"), load_hardware("h200"), load_hardware("a100")
    assert h100.mem_bandwidth_Bps == 3.35e12 and h200.mem_bandwidth_Bps == 4.8e12
    assert h100.peak_flops == h200.peak_flops == pytest.approx(989e12, rel=0.01)
    assert h100.cache_bytes == 50 * 2**20
    assert h200.cache_bytes == 60 * 2**20  # what the measured H200 reported (gpu.md)
    assert a100.mem_bandwidth_Bps == 2.039e12 and a100.peak_flops == 312e12
    assert a100.cache_bytes == 40 * 2**20
    ada = load_hardware("rtx6000-ada")
    assert ada.mem_bandwidth_Bps == 960e9 and ada.cache_bytes == 96 * 2**20
    assert load_hardware("cpu").provenance == "measured"


def test_every_builtin_profile_says_where_it_comes_from():
    """The main job stands on measured ground: h200 and cpu are fitted on runs, h100 and a100
    carry the H200's fitted constants (derived), and nothing else claims to be measured."""
    expected = {"h200": "measured", "cpu": "measured", "h100": "derived", "a100": "derived"}
    for name in list_hardware():
        hw = load_hardware(name)
        assert hw.provenance == expected.get(name, "estimate"), name
        assert hw.provenance_note, name
    h200, h100 = load_hardware("h200"), load_hardware("h100")
    assert "benchmarks/gpu/PROFILE.json" in h200.provenance_note
    for field in HardwareProfile.FIT_FIELDS:  # derived: the measured constants, carried
        assert getattr(h100, field) == getattr(h200, field), field
    with pytest.raises(ProfileError, match="provenance"):
        h200.replace(provenance="guessed")


def _raw_profiles(filename: str) -> dict:
    path = resources.files("feather_sched.cost").joinpath("profiles").joinpath(filename)
    return json.loads(path.read_text("utf-8"))["profiles"]


@pytest.mark.parametrize("filename", ["hardware.json", "models.json"])
def test_every_numeric_field_has_a_source(filename):
    for name, raw in _raw_profiles(filename).items():
        sources = raw["sources"]
        for key, value in raw.items():
            if isinstance(value, (int, float)):  # bools too: they are architecture facts
                text = sources.get(key, "")
                assert isinstance(text, str) and len(text) > 10, f"{name}.{key} has no source"


def test_loaded_profiles_carry_sources():
    profiles = [load_hardware(n) for n in list_hardware()] + [load_model(n) for n in list_models()]
    for p in profiles:
        for f in dataclasses.fields(p):
            value = getattr(p, f.name)
            if isinstance(value, (int, float)):
                assert f.name in p.sources, f"{p.name}.{f.name} has no source"


def test_unknown_name_lists_valid_names():
    with pytest.raises(ProfileError) as e:
        load_hardware("tpu-v9")
    msg = str(e.value)
    assert "tpu-v9" in msg
    for name in list_hardware():
        assert name in msg
    with pytest.raises(ProfileError, match="llama-3-8b"):
        load_model("gpt-5")


def test_bad_field_in_json_file_is_named(tmp_path, h100):
    data = h100.to_dict()
    data["name"] = "my-gpu"
    data["mem_bandwidth_Bps"] = -1
    path = tmp_path / "my-gpu.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError) as e:
        load_hardware(path)
    msg = str(e.value)
    assert "my-gpu" in msg and "mem_bandwidth_Bps" in msg and str(path) in msg

    data["mem_bandwidth_Bps"] = "fast"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="mem_bandwidth_Bps"):
        load_hardware(str(path))

    data["mem_bandwidth_Bps"] = 1e12
    data["bandwidth_efficency"] = 0.9  # typo
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="bandwidth_efficency"):
        load_hardware(path)

    del data["bandwidth_efficency"], data["peak_flops"]
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"missing field.*peak_flops"):
        load_hardware(path)


def test_bad_model_fields_are_named(tmp_path, llama):
    with pytest.raises(ProfileError, match=r"'llama-3-8b'.*num_layers"):
        llama.replace(num_layers=0)
    with pytest.raises(ProfileError, match="num_kv_heads"):
        llama.replace(num_kv_heads=5)
    path = tmp_path / "m.json"
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_model(path)
    with pytest.raises(ProfileError, match="not found"):
        load_model(tmp_path / "missing.json")


def test_multi_profile_file_rejected(tmp_path, h100):
    path = tmp_path / "two.json"
    path.write_text(json.dumps({"profiles": {"a": h100.to_dict(), "b": h100.to_dict()}}))
    with pytest.raises(ProfileError, match="exactly one"):
        load_hardware(path)
    path.write_text(json.dumps({"profiles": {"only": h100.to_dict()}}))
    assert load_hardware(path).name == "only"


def test_hardware_json_round_trip(tmp_path, h100):
    fitted = h100.replace(
        name="h100-fitted",
        bandwidth_efficiency=0.83,
        step_overhead_s=4.2e-4,
        reuse_exponent=1.7,
        sources={**h100.sources, "bandwidth_efficiency": "fitted by feather calibrate"},
    )
    path = fitted.save(tmp_path / "fitted.json")
    back = load_hardware(path)
    assert back == fitted
    assert dict(back.sources) == dict(fitted.sources)
    assert back.to_json() == fitted.to_json()
    assert json.loads(Path(path).read_text())["bandwidth_efficiency"] == 0.83
    # The fitted profile drives a cost model like a built-in one.
    assert StepCostModel(path, "llama-3-8b").hardware == fitted


def test_replace_validates_and_profiles_are_frozen(h100):
    with pytest.raises(ProfileError, match=r"'h100-free-l2'.*bandwidth_efficiency"):
        h100.replace(bandwidth_efficiency=1.5)
    with pytest.raises(ProfileError, match="cache_bytes"):
        h100.replace(cache_bytes=math.nan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        h100.peak_flops = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        h100.sources["peak_flops"] = "x"  # type: ignore[index]
    assert set(HardwareProfile.FIT_FIELDS) <= {f.name for f in dataclasses.fields(h100)}


# --------------------------------------------------------------------------- step model


def test_llama3_8b_batch1_decode_is_weight_bound_about_5ms(paged, ideal):
    shape = BatchShape.shared_prefix_decode([1], prefix_len=100)
    for model in (paged, ideal):
        cost = model.breakdown(shape)
        assert cost.bound == "memory"
        assert cost.weight_bytes > 100 * cost.kv_bytes_read
        assert 4.5 * MS <= cost.total_s <= 6.5 * MS
        assert cost.total_s == model.step_time(shape)


def test_big_prefill_is_compute_bound(paged):
    n = 8192
    shape = BatchShape(
        num_prefill_tokens=n,
        prefill_attn_pairs=n * (n + 1) // 2,
        logical_kv_tokens=n,
        unique_kv_tokens=n,
        num_prefill_seqs=1,
    )
    cost = paged.breakdown(shape)
    assert cost.compute_s > cost.memory_s
    assert cost.bound == "compute"
    assert cost.total_s == pytest.approx(cost.compute_s + cost.overhead_s)


def test_design_example_batch100_on_one_10k_prefix(paged, ideal):
    homogeneous = BatchShape.shared_prefix_decode([100], prefix_len=10_000)
    five_groups = BatchShape.shared_prefix_decode([20] * 5, prefix_len=10_000)
    no_sharing = BatchShape.shared_prefix_decode([1] * 100, prefix_len=10_000)

    t_ideal = ideal.step_time(homogeneous)
    assert 5 * MS <= t_ideal <= 6 * MS
    # One 10K prefix: 41 MB of KV per layer fits the usable L2 -> full reuse.
    assert paged.breakdown(homogeneous).shared_hit_rate == 1.0
    assert paged.step_time(homogeneous) == pytest.approx(t_ideal)
    # Five prefixes (205 MB per layer) overflow it; no sharing pays every context.
    t_five = paged.step_time(five_groups)
    t_none = paged.step_time(no_sharing)
    assert 40 * MS <= t_none <= 50 * MS
    assert t_ideal < ideal.step_time(five_groups) < t_five < t_none
    assert 0 < paged.breakdown(five_groups).shared_hit_rate < 0.5


@pytest.mark.parametrize("hw", ["h100-free-l2", "h200", "a100", "rtx6000-ada", "cpu"])
@pytest.mark.parametrize("model", ["llama-3-8b", "qwen2.5-0.5b", "longchat-13b"])
@pytest.mark.parametrize(("batch", "ctx"), [(8, 2_000), (32, 4_000), (100, 10_000)])
def test_homogeneous_batch_beats_heterogeneous(hw, model, batch, ctx):
    cm = StepCostModel(hw, model, KernelMode.PAGED)
    homogeneous = BatchShape.shared_prefix_decode([batch], prefix_len=ctx, suffix_len=50)
    mixed = BatchShape.shared_prefix_decode([1] * batch, prefix_len=ctx, suffix_len=50)
    assert homogeneous.logical_kv_tokens == mixed.logical_kv_tokens
    if hw == "cpu":
        # The placeholder CPU profile makes these batches compute-bound (0.09 TFLOPS
        # effective), where KV locality cannot help; it must never hurt.
        assert cm.step_time(homogeneous) <= cm.step_time(mixed)
    else:
        assert cm.step_time(homogeneous) < cm.step_time(mixed)


def test_empty_batch_costs_nothing(paged):
    assert paged.step_time(BatchShape()) == 0.0
    assert paged.breakdown(BatchShape()).total_s == 0.0


def test_reuse_model_shape(paged, h100, llama):
    cap = paged.cache_capacity_tokens
    assert cap == pytest.approx(
        h100.cache_bytes * h100.cache_efficiency / llama.kv_bytes_per_token_per_layer
    )
    assert paged.shared_hit_rate(cap) == 1.0
    assert paged.shared_hit_rate(2 * cap) == pytest.approx(0.5)
    steeper = StepCostModel(h100.replace(reuse_exponent=3.0), llama)
    assert steeper.shared_hit_rate(2 * cap) == pytest.approx(0.125)
    no_cache = StepCostModel(h100.replace(cache_bytes=0), llama)
    assert no_cache.shared_hit_rate(1) == 0.0


def test_block_tables_reference_matches_counts():
    bs = 16
    prefix = list(range(10))  # 10 shared blocks = 160 tokens
    tables = [[*prefix, 100 + i, 200 + i] for i in range(4)]  # + 2 private blocks each
    lens = [12 * bs - 3] * 4  # last block partially filled
    shape = BatchShape.from_block_tables(tables, bs, lens)
    assert shape.num_decode == 4
    assert shape.logical_kv_tokens == 4 * (12 * bs - 3)
    assert shape.shared_unique_kv_tokens == 10 * bs
    assert shape.shared_logical_kv_tokens == 4 * 10 * bs
    assert shape.unique_kv_tokens == 10 * bs + 4 * (2 * bs - 3)
    assert shape == BatchShape.shared_prefix_decode([4], 10 * bs, 2 * bs - 3)
    with pytest.raises(ValueError, match="does not fit"):
        BatchShape.from_block_tables([[1, 2]], bs, [40])


def test_span_follows_batch_order_and_decides_sequential_reuse():
    """Adjacent readers of a prefix re-read it after one context; interleaved ones after a
    context per group in between. A sequential-attention profile hits on the first and
    misses on the second once the span overflows its cache; a batch-wide profile cannot
    tell them apart."""
    bs, groups, per = 16, 4, 3
    tables = {
        g: [[1000 * g + j for j in range(8)] + [5000 + 10 * g + k] for k in range(per)]
        for g in range(groups)
    }
    grouped = [t for g in range(groups) for t in tables[g]]
    interleaved = [tables[g][k] for k in range(per) for g in range(groups)]
    a = BatchShape.from_block_tables(grouped, bs)
    b = BatchShape.from_block_tables(interleaved, bs)
    assert a.shared_span_tokens == 9 * bs and b.shared_span_tokens == groups * 9 * bs
    assert (a.shared_unique_kv_tokens, a.logical_kv_tokens) == (
        b.shared_unique_kv_tokens,
        b.logical_kv_tokens,
    )
    m = load_model("kv-bound")
    cache = 2 * 9 * bs * m.kv_bytes_per_token_per_layer  # holds two contexts of one layer
    hw = load_hardware("cpu").replace(cache_bytes=cache, cache_efficiency=1.0)
    seq = StepCostModel(hw, m)
    assert seq.order_sensitive
    assert seq.step_time(a) < seq.step_time(b)
    flat = StepCostModel(hw.replace(sequential_attention=False), m)
    assert flat.step_time(a) == flat.step_time(b)


def test_validate_rejects_impossible_shapes():
    with pytest.raises(ValueError, match="num_decode"):
        BatchShape(num_decode=-1).validate()
    with pytest.raises(ValueError, match="shared_logical"):
        BatchShape(num_decode=1, logical_kv_tokens=5, shared_logical_kv_tokens=10).validate()


# --------------------------------------------------------------------------- properties


@st.composite
def block_batches(draw):
    """Random decode batches over a few prefix trees, as block tables."""
    bs = draw(st.sampled_from([1, 16]))
    n_prefixes = draw(st.integers(1, 4))
    prefix_blocks = [
        [("p", p, j) for j in range(draw(st.integers(0, 40)))] for p in range(n_prefixes)
    ]
    tables, lens = [], []
    for i in range(draw(st.integers(1, 30))):
        p = draw(st.integers(0, n_prefixes - 1))
        shared = prefix_blocks[p][: draw(st.integers(0, len(prefix_blocks[p])))]
        own = [("s", i, j) for j in range(draw(st.integers(1, 20)))]
        blocks = shared + own
        tables.append(blocks)
        lens.append(len(blocks) * bs - draw(st.integers(0, bs - 1)))
    shape = BatchShape.from_block_tables(tables, bs, lens)
    prefill = draw(st.sampled_from([0, 0, 512]))
    return dataclasses.replace(
        shape,
        num_prefill_tokens=prefill,
        prefill_attn_pairs=prefill * prefill // 2,
        num_prefill_seqs=1 if prefill else 0,
    )


HW_NAMES = st.sampled_from(["h100-free-l2", "a100", "rtx6000-ada", "cpu"])
MODEL_NAMES = st.sampled_from(["llama-3-8b", "qwen2.5-7b", "qwen2.5-0.5b", "longchat-13b"])


@settings(max_examples=150, deadline=None)
@given(shape=block_batches(), hw=HW_NAMES, model=MODEL_NAMES)
def test_ideal_never_slower_than_paged_and_breakdown_agrees(shape, hw, model):
    shape.validate()
    assert shape.unique_kv_tokens == (
        shape.logical_kv_tokens - shape.shared_logical_kv_tokens + shape.shared_unique_kv_tokens
    )
    p = StepCostModel(hw, model, "paged")
    i = StepCostModel(hw, model, "ideal")
    assert i.step_time(shape) <= p.step_time(shape) * (1 + 1e-12)
    for cm in (p, i):
        cost = cm.breakdown(shape)
        assert cost.total_s == pytest.approx(cm.step_time(shape), rel=1e-12)
        assert 0.0 <= cost.cache_hit_fraction <= 1.0
        logical = shape.logical_kv_tokens * cm.model.kv_bytes_per_token
        unique = shape.unique_kv_tokens * cm.model.kv_bytes_per_token
        assert unique * (1 - 1e-12) <= cost.kv_bytes_read <= logical * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(
    shape=block_batches(),
    extra=st.integers(1, 200_000),
    hw=HW_NAMES,
    model=MODEL_NAMES,
    kernel=st.sampled_from(list(KernelMode)),
)
def test_more_logical_kv_never_faster(shape, extra, hw, model, kernel):
    cm = StepCostModel(hw, model, kernel)
    more = dataclasses.replace(
        shape,
        logical_kv_tokens=shape.logical_kv_tokens + extra,
        unique_kv_tokens=shape.unique_kv_tokens + extra,
    )
    assert cm.step_time(more) >= cm.step_time(shape)
    # Extra readers of already shared blocks add logical reads too.
    more_shared = dataclasses.replace(
        shape,
        logical_kv_tokens=shape.logical_kv_tokens + extra,
        shared_logical_kv_tokens=shape.shared_logical_kv_tokens + extra,
    )
    if shape.shared_unique_kv_tokens:
        assert cm.step_time(more_shared) >= cm.step_time(shape)


@settings(max_examples=150, deadline=None)
@given(
    shape=block_batches(),
    small=st.floats(0, 1e8),
    factor=st.floats(1, 100),
    eff=st.floats(0.05, 1.0),
    exponent=st.floats(0.25, 4.0),
    hw=HW_NAMES,
)
def test_more_cache_never_slower(shape, small, factor, eff, exponent, hw):
    base = load_hardware(hw).replace(reuse_exponent=exponent, cache_efficiency=eff)
    model = load_model("llama-3-8b")
    # Scale the shape up so shared working sets straddle the cache sizes.
    big = dataclasses.replace(
        shape,
        **{
            f: getattr(shape, f) * 100
            for f in (
                "logical_kv_tokens",
                "unique_kv_tokens",
                "shared_unique_kv_tokens",
                "shared_logical_kv_tokens",
            )
        },
    )
    for s in (shape, big):
        t_small = StepCostModel(base.replace(cache_bytes=small), model).step_time(s)
        t_big = StepCostModel(base.replace(cache_bytes=small * factor), model).step_time(s)
        assert t_big <= t_small * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(2, 256),
    ctx=st.integers(16, 32_000),
    groups=st.integers(2, 16),
    hw=HW_NAMES,
    model=MODEL_NAMES,
)
def test_fewer_prefix_groups_never_slower(n, ctx, groups, hw, model):
    cm = StepCostModel(hw, model)
    groups = min(groups, n)
    sizes = [n // groups + (1 if g < n % groups else 0) for g in range(groups)]
    one = cm.step_time(BatchShape.shared_prefix_decode([n], ctx, 8))
    several = cm.step_time(BatchShape.shared_prefix_decode(sizes, ctx, 8))
    none = cm.step_time(BatchShape.shared_prefix_decode([1] * n, ctx, 8))
    assert one <= several * (1 + 1e-12) <= none * (1 + 1e-12) ** 2


def test_step_time_is_fast(paged):
    shape = BatchShape.shared_prefix_decode([20] * 5, prefix_len=10_000)
    step_time = paged.step_time
    n = 20_000
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            step_time(shape)
        best = min(best, (time.perf_counter() - t0) / n)
    # Typically ~0.4 us here; a loose bound so a loaded CI machine does not flake.
    assert best < 10e-6
