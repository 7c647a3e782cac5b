"""Feather's settings: one set of environment variables for every engine adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

from feather_sched.host.tracker import chunk_blocks
from feather_sched.settings import ENV, FeatherSettings, PolicyStateSaver, SettingsError


def test_defaults() -> None:
    s = FeatherSettings.from_env({})
    assert (s.policy, s.chunk_tokens, s.policy_state, s.policy_state_every_s) == (
        "feather",
        64,
        None,
        60.0,
    )
    assert s.make_policy().name == "feather"
    assert s.state_saver() is None
    assert FeatherSettings.from_env({}, default_policy=None).enabled is False


def test_values_are_read_and_typed() -> None:
    env = {
        "FEATHER_POLICY": "grouped",
        "FEATHER_POLICY_OPTIONS": '{"max_batch": 3}',
        "FEATHER_CHUNK_TOKENS": "256",
    }
    s = FeatherSettings.from_env(env)
    policy = s.make_policy()
    assert policy.name == "grouped" and policy.max_batch == 3  # type: ignore[attr-defined]
    assert s.chunk_tokens == 256
    assert FeatherSettings.from_env({"FEATHER_POLICY": "off"}).enabled is False


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"FEATHER_POLICY": "nope"}, ["FEATHER_POLICY", "'nope'", "grouped"]),
        ({"FEATHER_POLICY_OPTIONS": "[1]"}, ["FEATHER_POLICY_OPTIONS", "JSON object"]),
        ({"FEATHER_POLICY_OPTIONS": "{"}, ["FEATHER_POLICY_OPTIONS", "JSON"]),
        ({"FEATHER_CHUNK_TOKENS": "0"}, ["FEATHER_CHUNK_TOKENS", "> 0"]),
        ({"FEATHER_CHUNK_TOKENS": "6.5"}, ["FEATHER_CHUNK_TOKENS", "integer"]),
        ({"FEATHER_POLICY_STATE_EVERY_S": "soon"}, ["FEATHER_POLICY_STATE_EVERY_S", "number"]),
        ({"FEATHER_POLICY_STATE_EVERY_S": "-1"}, ["FEATHER_POLICY_STATE_EVERY_S", "> 0"]),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], names: list[str]) -> None:
    with pytest.raises(SettingsError) as err:
        FeatherSettings.from_env(env)
    for name in names:
        assert name in str(err.value)


def test_bad_policy_option_names_the_variables() -> None:
    s = FeatherSettings.from_env(
        {"FEATHER_POLICY": "grouped", "FEATHER_POLICY_OPTIONS": '{"x": 1}'}
    )
    with pytest.raises(SettingsError, match="FEATHER_POLICY_OPTIONS"):
        s.make_policy()


def test_policy_state(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    env = {"FEATHER_POLICY_STATE": str(path), "FEATHER_POLICY": "grouped"}
    with pytest.raises(SettingsError, match="keeps no learned state"):
        FeatherSettings.from_env(env).make_policy()
    env["FEATHER_POLICY"] = "feather"
    env["FEATHER_POLICY_STATE_EVERY_S"] = "30"
    s = FeatherSettings.from_env(env)
    cold = s.make_policy()  # no file yet: starts cold
    saver = s.state_saver()
    assert saver is not None and saver.every_s == 30.0 and saver.path == path
    cold.decisions = 0  # type: ignore[attr-defined]
    saver.save(cold)
    assert saver.saves == 1 and path.is_file()
    warm = s.make_policy()  # the file exists now: loaded
    assert warm.table.stats == cold.table.stats  # type: ignore[attr-defined]


def test_saver_never_raises(tmp_path: Path) -> None:
    s = FeatherSettings.from_env({"FEATHER_POLICY": "feather"})
    bad = PolicyStateSaver(tmp_path / "no-such-dir" / "s.json", every_s=0.0)
    bad.save(s.make_policy())  # logged, not raised
    assert bad.saves == 0


def test_saver_saves_on_its_period(tmp_path: Path) -> None:
    t = iter([0.0, 10.0, 59.0, 61.0, 61.0])
    saver = PolicyStateSaver(tmp_path / "s.json", every_s=60.0, clock=lambda: next(t))
    policy = FeatherSettings.from_env({}).make_policy()
    saver.maybe_save(policy)  # 10 s after start: not yet
    saver.maybe_save(policy)  # 59 s
    assert saver.saves == 0
    saver.maybe_save(policy)  # 61 s: saved (the clock is read again to restart the period)
    assert saver.saves == 1


def test_the_old_names_are_gone() -> None:
    assert set(ENV.values()) == {
        "FEATHER_POLICY",
        "FEATHER_POLICY_OPTIONS",
        "FEATHER_CHUNK_TOKENS",
        "FEATHER_POLICY_STATE",
        "FEATHER_POLICY_STATE_EVERY_S",
    }


@pytest.mark.parametrize(
    ("tokens", "block", "blocks"), [(64, 16, 4), (64, 32, 2), (64, 128, 1), (100, 32, 3)]
)
def test_vllm_chunk_is_whole_blocks(tokens: int, block: int, blocks: int) -> None:
    assert chunk_blocks(tokens, block) == blocks
