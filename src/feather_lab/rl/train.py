"""Train `feather-ppo`: stable-baselines3 PPO on FeatherEnv, exported to a numpy .npz.

Needs the `rl` extra. The actor is a [32, 32] tanh MLP, cheap enough to run in numpy at
decision time. The mix (`DEFAULT_MIX`) holds the workloads where ADD/STOP matters, scaled so an
episode simulates in under a second. The actor first imitates the bandit (`rl.teacher`), since
PPO from scratch collapses to one action everywhere; PPO then fine-tunes with a small learning
rate, discounting per engine step (`rl.step_discount`)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from feather_lab.rl import TRAIN_HARDWARE, TRAIN_MODEL
from feather_lab.sim.config import EngineConfig
from feather_lab.workloads import make_workload
from feather_lab.workloads.base import Workload
from feather_lab.workloads.presets import DEFAULT_MAX_NUM_SEQS, PRESETS, Preset, build_workload
from feather_sched.cost.resolve import resolve_cost
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.numpy_mlp import NumpyMLP
from feather_sched.policies.observation import FEATURES

__all__ = [
    "DEFAULT_MIX",
    "MixEntry",
    "RLMissingError",
    "TrainConfig",
    "TrainReport",
    "export_actor",
    "require_rl",
    "train",
]

RL_PACKAGES = ("gymnasium", "stable_baselines3", "torch")


class RLMissingError(ImportError):
    """The `rl` extra is not installed."""


def require_rl() -> None:
    missing = [p for p in RL_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        raise RLMissingError(
            f"training needs the 'rl' extra (missing: {', '.join(missing)}); install it with "
            "`pip install torch==2.13.0` (the CPU wheel) then `pip install -e .[rl]`"
        )


@dataclass(frozen=True)
class MixEntry:
    """One training workload: a generator name with overrides, and the engine it runs on."""

    workload: str
    overrides: dict[str, Any] = field(default_factory=dict)
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS

    @classmethod
    def from_preset(cls, preset: Preset) -> MixEntry:
        return cls(preset.base, dict(preset.overrides), preset.max_num_seqs)

    def build(self) -> Workload:
        if self.overrides:
            return make_workload(self.workload, **self.overrides)
        # a bare name means the bench's version of it (e.g. long-prefix = 5 x 200, not 1 x 200)
        return build_workload(self.workload)


DEFAULT_MIX: tuple[MixEntry, ...] = tuple(map(MixEntry.from_preset, PRESETS["train"].values()))


@dataclass(frozen=True)
class TrainConfig:
    """PPO settings. One env step is one ADD/STOP decision."""

    steps: int = 100_000
    seed: int = 0
    hardware: str = TRAIN_HARDWARE
    model: str = TRAIN_MODEL
    kernel: str = "paged"
    """The cost model's names (kept as names: the weights' metadata records them);
    `train` resolves them once (`cost.resolve_cost`)."""
    gamma: float = 0.95
    """Discount per engine step (`rl.step_discount`), not per decision: ~20-step horizon."""
    gae_lambda: float = 0.95
    learning_rate: float = 1e-4
    n_steps: int = 256
    """Decisions per environment (= per mix entry) per PPO update."""
    batch_size: int = 256
    n_epochs: int = 5
    ent_coef: float = 0.0
    actor: tuple[int, ...] = (32, 32)
    critic: tuple[int, ...] = (64, 64)
    warm_start: bool = True
    """Imitate the bandit before PPO (`rl.teacher`); without it PPO starts at 50/50."""
    imitation_epochs: int = 300


@dataclass
class TrainReport:
    out: Path
    steps: int
    episodes: int
    seconds: float
    episode_tok_s: list[float]
    """Output tokens/s of each finished training episode, in order (the learning curve)."""


def export_actor(policy: Any, meta: dict[str, Any] | None = None) -> NumpyMLP:
    """The actor of an sb3 ActorCriticPolicy (Linear/activation stack + action_net) as numpy."""
    import torch.nn as nn

    weights, biases = [], []
    activation = None
    for layer in policy.mlp_extractor.policy_net:
        if isinstance(layer, nn.Linear):
            weights.append(layer.weight.detach().cpu().numpy().T)
            biases.append(layer.bias.detach().cpu().numpy())
        elif isinstance(layer, nn.Tanh):
            activation = activation or "tanh"
        elif isinstance(layer, nn.ReLU):
            activation = activation or "relu"
        else:
            raise TypeError(f"cannot export actor layer {layer!r}")
    head = policy.action_net
    weights.append(head.weight.detach().cpu().numpy().T)
    biases.append(head.bias.detach().cpu().numpy())
    return NumpyMLP(weights, biases, activation or "tanh", FEATURES, meta)


def _imitate_bandit(
    policy: Any, mix: Sequence[MixEntry], config: TrainConfig, cost: StepCostModel
) -> dict:
    """Fit the actor to the bandit's greedy choices (cross-entropy, full batch)."""
    import torch

    from feather_lab.rl.teacher import collect_demonstrations

    entries = [(e.build(), EngineConfig(max_num_seqs=e.max_num_seqs)) for e in mix]
    obs, actions = collect_demonstrations(entries, cost, seed=config.seed)
    if len(actions) == 0:
        return {"decisions": 0}
    x = torch.as_tensor(obs, dtype=torch.float32)
    y = torch.as_tensor(actions)
    params = [*policy.mlp_extractor.policy_net.parameters(), *policy.action_net.parameters()]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    for _ in range(config.imitation_epochs):
        loss = -policy.get_distribution(x).log_prob(y).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        agree = (policy.get_distribution(x).mode() == y).float().mean().item()
    return {
        "decisions": len(actions),
        "stop_share": round(float(actions.mean()), 3),
        "agreement": round(agree, 3),
    }


PPO_SETTINGS = (
    "learning_rate",
    "n_steps",
    "batch_size",
    "n_epochs",
    "gamma",
    "gae_lambda",
    "ent_coef",
)
"""TrainConfig fields passed to sb3's PPO under the same names."""


def train(
    out: str | Path,
    config: TrainConfig = TrainConfig(),
    mix: Sequence[MixEntry] = DEFAULT_MIX,
    progress: bool = True,
    on_episode: Callable[[float], None] | None = None,
    cost: StepCostModel | None = None,
) -> TrainReport:
    """Train PPO for `config.steps` decisions on `mix`, save the actor to `out` (.npz).
    `cost`: the cost model of `config`'s names, when the caller already resolved (and so
    checked) it; None resolves them here."""
    require_rl()
    import torch

    from feather_lab.rl.progress import EpisodeCallback

    if config.steps < 1:
        raise ValueError(f"steps must be >= 1, got {config.steps}")
    if not mix:
        raise ValueError("empty training mix")
    if cost is None:
        cost = resolve_cost(config.hardware, config.model, config.kernel)
    torch.set_num_threads(1)  # tiny nets: threads cost more than they save
    venv = _vec_env(mix, config, cost)
    model = _ppo(venv, config)
    imitation = _imitate_bandit(model.policy, mix, config, cost) if config.warm_start else None
    callback = EpisodeCallback(config.steps, show=progress, on_episode=on_episode)
    start = time.perf_counter()
    try:
        model.learn(total_timesteps=config.steps, callback=callback)
    finally:
        venv.close()
    seconds = time.perf_counter() - start
    meta = _weights_meta(int(model.num_timesteps), seconds, config, mix, imitation)
    path = export_actor(model.policy, meta).save(out)
    curve = list(callback.episode_tok_s)
    return TrainReport(path, int(model.num_timesteps), len(curve), seconds, curve)


def _env_maker(entry: MixEntry, cost: StepCostModel) -> Callable[[], Any]:
    """A FeatherEnv factory for one mix entry; builds the workload now, to fail here rather
    than inside the vector env."""
    from feather_lab.rl.env import FeatherEnv

    workload = entry.build()
    engine = EngineConfig(max_num_seqs=entry.max_num_seqs)

    def make() -> FeatherEnv:
        return FeatherEnv(workload, cost=cost, engine=engine)

    return make


def _vec_env(mix: Sequence[MixEntry], config: TrainConfig, cost: StepCostModel) -> Any:
    """One env per mix entry, rewards normalised for the critic.

    Every rollout then holds n_steps decisions of each workload, whatever its episode length
    (a STOP-heavy shared-prefix episode asks ~30x more decisions than a long-prefix one and
    would otherwise drown it).
    """
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    venv = DummyVecEnv([_env_maker(entry, cost) for entry in mix])
    venv.seed(config.seed)
    return VecNormalize(venv, norm_obs=False, norm_reward=True, gamma=config.gamma)


def _ppo(venv: Any, config: TrainConfig) -> Any:
    """sb3 PPO with the config's settings, discounting per engine step (`rl.step_discount`)."""
    from stable_baselines3 import PPO

    from feather_lab.rl.step_discount import StepDiscountBuffer

    return PPO(
        "MlpPolicy",
        venv,
        **{name: getattr(config, name) for name in PPO_SETTINGS},
        rollout_buffer_class=StepDiscountBuffer,
        policy_kwargs={"net_arch": {"pi": list(config.actor), "vf": list(config.critic)}},
        seed=config.seed,
        device="cpu",
        verbose=0,
    )


def _weights_meta(
    steps: int,
    seconds: float,
    config: TrainConfig,
    mix: Sequence[MixEntry],
    imitation: dict | None,
) -> dict[str, Any]:
    """What the saved weights record about their training, so a .npz says how it was made."""
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}
    return {
        "trained_steps": steps,
        "train_seconds": round(seconds, 1),
        "config": settings,
        "mix": [asdict(e) for e in mix],
        "imitation": imitation,
    }


def torch_logits(policy: Any, obs: np.ndarray) -> np.ndarray:
    """The sb3 policy's ADD/STOP logits for a batch of observations (for export checks)."""
    import torch

    with torch.no_grad():
        dist = policy.get_distribution(torch.as_tensor(obs, dtype=torch.float32))
        return dist.distribution.logits.cpu().numpy()
