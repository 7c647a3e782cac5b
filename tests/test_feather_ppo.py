"""feather-ppo: the numpy MLP, the shipped weights, the policy in the simulator, training."""

from __future__ import annotations

import importlib.util
import itertools
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from feather_lab.cli import app
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.workloads import LongPrefixWorkload, NoSharingWorkload
from feather_sched.cost import StepCostModel
from feather_sched.policies.feather_ppo import (
    WEIGHTS_ENV,
    FeatherPPOPolicy,
    default_weights_path,
)
from feather_sched.policies.numpy_mlp import NumpyMLP
from feather_sched.policies.observation import FEATURES, OBS_DIM
from feather_sched.policies.registry import make_policy, policy_names

COST = StepCostModel("h100-free-l2", "llama-3-8b")
HAVE_RL = all(importlib.util.find_spec(p) for p in ("gymnasium", "stable_baselines3", "torch"))
needs_rl = pytest.mark.skipif(not HAVE_RL, reason="needs the 'rl' extra (sb3 + torch)")


def _random_mlp(seed: int = 0, features=FEATURES) -> NumpyMLP:
    rng = np.random.default_rng(seed)
    sizes = [len(features), 32, 32, 2]
    weights = [rng.normal(size=(a, b)).astype(np.float32) for a, b in itertools.pairwise(sizes)]
    biases = [rng.normal(size=b).astype(np.float32) for b in sizes[1:]]
    return NumpyMLP(weights, biases, "tanh", features, {"note": "test"})


def test_numpy_mlp_forward_and_round_trip(tmp_path: Path) -> None:
    net = _random_mlp()
    x = np.random.default_rng(1).random((5, OBS_DIM), dtype=np.float32)
    w, b = net.weights, net.biases
    expected = np.tanh(np.tanh(x @ w[0] + b[0]) @ w[1] + b[1]) @ w[2] + b[2]
    np.testing.assert_allclose(net.logits(x), expected, rtol=1e-6)
    assert net.act(x[0]) == int(np.argmax(expected[0]))

    path = net.save(tmp_path / "net.npz")
    back = NumpyMLP.load(path, expect_features=FEATURES)
    np.testing.assert_array_equal(back.logits(x), net.logits(x))
    assert back.meta == {"note": "test"} and back.features == FEATURES

    with pytest.raises(ValueError, match="retrain"):
        NumpyMLP.load(path, expect_features=(*FEATURES, "extra"))
    with pytest.raises(FileNotFoundError, match="policy weights not found"):
        NumpyMLP.load(tmp_path / "missing.npz")
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros(3))
    with pytest.raises(ValueError, match="not a feather policy-weights"):
        NumpyMLP.load(bad)
    with pytest.raises(ValueError, match="do not fit"):
        NumpyMLP([np.zeros((3, 4))], [np.zeros(5)])


def test_shipped_weights_are_small_and_fit_the_observation() -> None:
    path = default_weights_path()
    assert path.is_file() and path.stat().st_size < 16_000
    policy = FeatherPPOPolicy()
    assert policy.net.in_dim == OBS_DIM and policy.net.out_dim == 2
    assert policy.net.meta.get("trained_steps", 0) > 0


def test_registry_and_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "feather-ppo" in policy_names()
    assert isinstance(make_policy("feather-ppo"), FeatherPPOPolicy)
    other = _random_mlp(3).save(tmp_path / "other.npz")
    monkeypatch.setenv(WEIGHTS_ENV, str(other))
    assert default_weights_path() == other
    np.testing.assert_array_equal(
        make_policy("feather-ppo").net.weights[0], _random_mlp(3).weights[0]
    )


def test_runs_in_the_simulator_and_finishes_every_request() -> None:
    reqs = LongPrefixWorkload(
        num_prefixes=4, prefix_len=6000, requests_per_prefix=40, output_len=20
    ).generate(0)
    policy = FeatherPPOPolicy()
    result = simulate(reqs, policy, COST, EngineConfig(max_num_seqs=128))
    assert len(result.records) == len(reqs)
    assert policy.decisions > 0

    quiet = NoSharingWorkload(num_requests=30, prompt_len=200, output_len=4).generate(0)
    policy = FeatherPPOPolicy()
    result = simulate(quiet, policy, COST, EngineConfig(max_num_seqs=8))
    assert len(result.records) == len(quiet) and policy.decisions == 0


def test_decision_cost_is_microseconds() -> None:
    """The numpy forward pass (what `choose` adds to a Feather decision)."""
    policy = FeatherPPOPolicy()
    obs = np.random.default_rng(0).random((2000, OBS_DIM), dtype=np.float32)
    policy.choose(obs[0])
    start = time.perf_counter()
    for row in obs:
        policy.choose(row)
    per_call = (time.perf_counter() - start) / len(obs)
    assert per_call < 100e-6  # ~5 us on the 2-core dev box; loose for shared CI machines


def test_train_without_rl_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import feather_lab.rl.train as train_mod

    monkeypatch.setattr(train_mod, "RL_PACKAGES", ("surely_not_installed_pkg",))
    result = CliRunner().invoke(app, ["train", "--steps", "10"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())  # rich wraps long lines
    assert "pip install -e .[rl]" in text and "surely_not_installed_pkg" in text


@pytest.mark.rl
@needs_rl
def test_export_matches_torch_and_train_writes_loadable_weights(tmp_path: Path) -> None:
    from stable_baselines3 import PPO

    from feather_lab.rl.env import FeatherEnv
    from feather_lab.rl.train import MixEntry, TrainConfig, export_actor, torch_logits, train

    small = LongPrefixWorkload(
        num_prefixes=3, prefix_len=4000, requests_per_prefix=20, output_len=10
    )
    env = FeatherEnv(small)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=64,
        batch_size=64,
        n_epochs=1,
        seed=0,
        device="cpu",
        policy_kwargs={"net_arch": {"pi": [32, 32], "vf": [64, 64]}},
    )
    model.learn(64)
    env.close()
    net = export_actor(model.policy)
    x = np.random.default_rng(0).random((256, OBS_DIM), dtype=np.float32)
    ours = net.logits(x)
    ours = ours - np.log(np.exp(ours).sum(axis=1, keepdims=True))  # torch normalises logits
    np.testing.assert_allclose(ours, torch_logits(model.policy, x), atol=1e-5)
    actions, _ = model.predict(x, deterministic=True)
    np.testing.assert_array_equal(actions, [net.act(row) for row in x])

    config = TrainConfig(steps=128, n_steps=64, batch_size=64, n_epochs=1)
    mix = [
        MixEntry(
            "long-prefix",
            {"num_prefixes": 2, "prefix_len": 3000, "requests_per_prefix": 15, "output_len": 8},
        )
    ]
    report = train(tmp_path / "w.npz", config, mix, progress=False)
    assert report.steps >= 128 and report.out.is_file()
    policy = FeatherPPOPolicy(weights=report.out)
    assert policy.net.meta["trained_steps"] == report.steps


@pytest.mark.rl
@needs_rl
def test_cli_train(tmp_path: Path) -> None:
    out = tmp_path / "cli.npz"
    result = CliRunner().invoke(
        app, ["train", "--workload", "document-qa", "--steps", "64", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert out.is_file() and "trained" in result.output
    assert FeatherPPOPolicy(weights=out).net.out_dim == 2


@pytest.mark.rl
@needs_rl
def test_step_discount_shares_a_pass_undiscounted() -> None:
    import torch
    from gymnasium import spaces

    from feather_lab.rl.step_discount import StepDiscountBuffer

    buf = StepDiscountBuffer(
        3, spaces.Box(0, 1, (OBS_DIM,)), spaces.Discrete(2), gamma=0.5, gae_lambda=1.0
    )
    # decision 0 -> 1 in the same pass (0 engine steps), 1 -> 2 one step, 2 -> end two steps
    for gap, reward in ((0, 0.0), (1, 1.0), (2, 4.0)):
        buf.set_next_gaps([{"engine_steps": gap}])
        buf.add(
            np.zeros((1, OBS_DIM)),
            np.zeros((1, 1)),
            np.array([reward]),
            np.array([0.0]),
            torch.zeros(1),
            torch.zeros(1),
        )
    buf.compute_returns_and_advantage(torch.zeros(1), np.array([1.0]))
    # returns: r2 = 4; r1 = 1 + 0.5 * 4 = 3; r0 = 0 + 0.5**0 * 3 = 3 (no discount in a pass)
    np.testing.assert_allclose(buf.returns[:, 0], [3.0, 3.0, 4.0])
