"""FeatherEnv: gymnasium contract, determinism, action effects, thread hygiene."""

from __future__ import annotations

import gc
import threading
import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.rl

gym = pytest.importorskip("gymnasium", reason="FeatherEnv needs gymnasium (dev/rl extra)")

from gymnasium.utils.env_checker import check_env  # noqa: E402

from feather_lab.rl.env import FeatherEnv, baseline_throughput  # noqa: E402
from feather_lab.sim.config import EngineConfig  # noqa: E402
from feather_lab.sim.engine import simulate  # noqa: E402
from feather_lab.workloads import LongPrefixWorkload, NoSharingWorkload  # noqa: E402
from feather_sched.policies.bandit import ADD, STOP  # noqa: E402
from feather_sched.policies.observation import OBS_DIM, DelegatedFeather  # noqa: E402

# 3 prefixes of 4,000 tokens: their KV fits the H100 L2 together, so mixing them pays.
SMALL = LongPrefixWorkload(num_prefixes=3, prefix_len=4000, requests_per_prefix=30, output_len=20)


def _env_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("feather-env-")]


def _play(env: FeatherEnv, actions, seed: int | None = 0):
    """Run one episode; `actions` is a constant or a callable(step index) -> action."""
    obs, info = env.reset(seed=seed)
    trace = [obs.copy()]
    rewards = []
    i = 0
    while True:
        act = actions(i) if callable(actions) else actions
        obs, reward, terminated, truncated, info = env.step(act)
        trace.append(obs.copy())
        rewards.append(reward)
        i += 1
        if terminated or truncated:
            return np.array(trace), np.array(rewards), info


def test_check_env_passes() -> None:
    env = FeatherEnv(SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no spec, cannot test render modes"
        check_env(env, skip_render_check=True)
    env.close()
    assert not _env_threads()


def test_spaces_rewards_and_engine_steps() -> None:
    env = FeatherEnv(SMALL)
    assert env.action_space.n == 2 and env.observation_space.shape == (OBS_DIM,)
    obs, _ = env.reset(seed=0)
    trace, steps, rewards = [obs], [], []
    while True:
        obs, reward, terminated, _, info = env.step(ADD)
        trace.append(obs)
        rewards.append(reward)
        steps.append(info["engine_steps"])
        if terminated:
            break
    assert all(o.dtype == np.float32 and env.observation_space.contains(o) for o in trace)
    assert 0 < sum(steps) <= env.last_result.num_steps
    assert steps.count(0) > 0  # ADDs of one admission pass: no engine step in between
    # the reference rate is FCFS's decode throughput on the same requests
    requests = SMALL.generate(env.episode_info["episode_seed"])
    rho = baseline_throughput(requests, env.cost, env.engine)
    assert env._rho == pytest.approx(rho) and rho > 0
    assert np.isfinite(rewards).all() and any(r != 0 for r in rewards)
    env.close()


def test_deterministic_for_a_seed_and_varied_across_resets() -> None:
    pattern = np.random.default_rng(7).integers(0, 2, 10_000)
    a, b = FeatherEnv(SMALL), FeatherEnv(SMALL)
    ta, ra, ia = _play(a, lambda i: pattern[i], seed=3)
    tb, rb, ib = _play(b, lambda i: pattern[i], seed=3)
    np.testing.assert_array_equal(ta, tb)
    np.testing.assert_array_equal(ra, rb)
    assert ia == ib
    tc, rc, _ = _play(a, lambda i: pattern[i], seed=3)  # same env, reseeded
    np.testing.assert_array_equal(ta, tc)
    np.testing.assert_array_equal(ra, rc)
    # without a seed, each reset draws a new episode from the env's generator
    a.reset(seed=1)
    first = a.episode_info["episode_seed"]
    a.reset()
    assert a.episode_info["episode_seed"] != first
    a.close()
    b.close()


def test_actions_change_the_run_and_every_request_finishes() -> None:
    env = FeatherEnv(SMALL)
    _, r_add, info_add = _play(env, ADD)
    n = env.episode_info["requests"]
    assert len(env.last_result.records) == n == info_add["requests"] == 90
    _, r_stop, info_stop = _play(env, STOP)
    assert len(env.last_result.records) == n
    # mixing these prefixes is cheap, so ADD is faster and the return says so
    assert info_add["output_tok_s"] > 1.2 * info_stop["output_tok_s"]
    assert r_add.sum() > r_stop.sum()
    env.close()


def test_decision_points_are_the_delegated_policys() -> None:
    """The env asks exactly where a DelegatedFeather asks: an all-STOP agent reproduces a
    policy that answers STOP everywhere, decision for decision."""
    env = FeatherEnv(SMALL)
    _, rewards, info = _play(env, STOP, seed=5)
    requests = SMALL.generate(env.episode_info["episode_seed"])

    class AllStop(DelegatedFeather):
        def choose(self, observation: np.ndarray) -> int:
            return STOP

    policy = AllStop(max_hold_steps=None)  # as the env's (its holds are unbounded)
    result = simulate(requests, policy, env.cost, env.engine)
    assert policy.decisions == len(rewards)  # one env step per bandit decision
    assert result.output_tok_s == pytest.approx(info["output_tok_s"])
    env.close()


def test_threads_are_cleaned_up() -> None:
    env = FeatherEnv(SMALL)
    env.reset(seed=0)
    env.step(ADD)
    assert len(_env_threads()) == 1
    env.reset(seed=1)  # abandons the first episode mid-way
    assert len(_env_threads()) == 1
    env.close()
    assert not _env_threads()
    env.close()  # idempotent

    dropped = FeatherEnv(SMALL)
    dropped.reset(seed=0)
    worker = _env_threads()[0]
    del dropped
    gc.collect()
    worker.join(timeout=5)
    assert not worker.is_alive()  # a forgotten env does not leave its worker blocked


def test_errors() -> None:
    env = FeatherEnv(SMALL)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(ADD)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action must be"):
        env.step(2)
    env.close()
    quiet = FeatherEnv(
        NoSharingWorkload(num_requests=8, prompt_len=64, output_len=2),
        engine=EngineConfig(max_num_seqs=4),
        max_tries=2,
    )
    with pytest.raises(RuntimeError, match="asked no ADD/STOP decision"):
        quiet.reset(seed=0)
    quiet.close()
    with pytest.raises(ValueError, match="at least one workload"):
        FeatherEnv([])
    assert not _env_threads()


def test_mix_draws_several_workloads() -> None:
    other = LongPrefixWorkload(
        num_prefixes=2, prefix_len=2000, requests_per_prefix=10, output_len=5
    )
    env = FeatherEnv([SMALL, other])
    seen = set()
    for seed in range(8):
        env.reset(seed=seed)
        seen.add(env.episode_info["workload_index"])
    assert seen == {0, 1}
    env.close()
