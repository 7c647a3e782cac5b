"""The one table of named workload settings (`workloads.presets`) and its readers."""

from __future__ import annotations

import pytest

from feather_lab.bench.suite import SUITE, BenchSpec, build_workload
from feather_lab.rl.train import DEFAULT_MIX, MixEntry
from feather_lab.workloads import LongPrefixWorkload, SharedPrefixWorkload, TreeWorkload
from feather_lab.workloads.presets import PAPER_SHAPE, PRESETS, Preset, paper


def test_suite_and_training_mix_read_the_table() -> None:
    assert SUITE is PRESETS["sim"]
    assert list(SUITE) == [
        "shared-prefix", "long-prefix", "document-qa", "no-sharing",
        "paper-1g", "paper-2g", "paper-5g", "paper-20g", "paper-100g", "long-context",
    ]  # fmt: skip
    assert tuple(MixEntry.from_preset(p) for p in PRESETS["train"].values()) == DEFAULT_MIX
    assert [e.max_num_seqs for e in DEFAULT_MIX] == [500] * 4 + [256] * 5


def test_paper_preset_is_one_shape_at_two_sizes() -> None:
    sim, train = PRESETS["sim"]["paper-5g"], PRESETS["train"]["paper-5g"]
    assert sim == paper(5) and train == paper(5, 400)
    assert sim.overrides == {"num_prefixes": 5, "requests_per_prefix": 200, **PAPER_SHAPE}
    assert train.overrides["requests_per_prefix"] == 80
    assert sim.max_num_seqs == train.max_num_seqs == 500
    assert BenchSpec().engine_for("paper-5g").max_num_seqs == 500
    assert paper(3, 2).overrides["requests_per_prefix"] == 1  # never an empty group


def test_build_workload() -> None:
    w = build_workload("long-prefix")
    assert isinstance(w, LongPrefixWorkload)
    assert (w.num_prefixes, w.requests_per_prefix) == (5, 200)
    assert build_workload("shared-prefix") == SharedPrefixWorkload()
    assert isinstance(build_workload("tree"), TreeWorkload)  # not a preset: the generator
    # one name, one workload: the Python generator by name is the bench's workload
    from feather_lab.workloads import make_workload

    for name in ("long-prefix", "shared-prefix", "document-qa", "no-sharing"):
        assert make_workload(name) == build_workload(name), name
    # a bare training entry means the bench's version of the workload
    assert MixEntry("long-prefix").build() == w
    assert Preset("no-sharing").max_num_seqs == 256


@pytest.mark.parametrize(
    ("scale", "name"), [(scale, name) for scale, table in PRESETS.items() for name in table]
)
def test_every_preset_builds(scale: str, name: str) -> None:
    preset = PRESETS[scale][name]
    workload = preset.build()
    for field, value in preset.overrides.items():
        if field != "arrival":
            assert getattr(workload, field) == value


def test_engine_scales_read_the_table() -> None:
    """vLLM's engine bench runs its workloads from the one preset table."""
    from feather_lab.harness.vllm_engine import ENGINE_SCALES

    for model, scale in ENGINE_SCALES.items():
        table = {name: (p.base, p.overrides) for name, p in PRESETS[model].items()}
        assert scale.workloads == table
        assert set(scale.default_workloads) <= set(table)
