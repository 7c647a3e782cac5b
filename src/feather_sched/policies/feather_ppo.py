"""feather-ppo: Feather's decisions made by a small PPO-trained network, run in numpy.

Same candidate order, starvation guard and automatic ADDs as `feather` (it subclasses it); the
ADD/STOP choice comes from a [32, 32] tanh MLP over `policies.observation`, trained offline
(`feather train`), run in numpy so the policy needs neither torch nor the `rl` extra. It does
not learn online: it is as good as its training mix and hardware profile (the shipped weights:
H100 + Llama-3-8B, their .npz carrying the settings in `net.meta`). `FEATHER_PPO_WEIGHTS=PATH`
swaps in other weights wherever the policy is made by name.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import numpy as np

from feather_sched.policies.numpy_mlp import NumpyMLP
from feather_sched.policies.observation import FEATURES, DelegatedFeather
from feather_sched.policies.starvation import MAX_WAIT_S

__all__ = ["DEFAULT_WEIGHTS", "WEIGHTS_ENV", "FeatherPPOPolicy", "default_weights_path"]

DEFAULT_WEIGHTS = "weights/feather_ppo.npz"
WEIGHTS_ENV = "FEATHER_PPO_WEIGHTS"
"""Environment variable naming other weights (e.g. from `feather train`) for by-name use."""


def default_weights_path() -> Path:
    """$FEATHER_PPO_WEIGHTS when set, else the weights shipped in the package."""
    override = os.environ.get(WEIGHTS_ENV)
    if override:
        return Path(override)
    return Path(str(resources.files("feather_sched.policies").joinpath(DEFAULT_WEIGHTS)))


class FeatherPPOPolicy(DelegatedFeather):
    name = "feather-ppo"

    def __init__(self, weights: str | Path | None = None, max_wait_s: float = MAX_WAIT_S) -> None:
        super().__init__(max_wait_s=max_wait_s)
        self.net = NumpyMLP.load(weights or default_weights_path(), expect_features=FEATURES)
        if self.net.out_dim != 2:
            raise ValueError(
                f"feather-ppo needs 2 logits (ADD, STOP), the net has {self.net.out_dim}"
            )

    def choose(self, observation: np.ndarray) -> int:
        return self.net.act(observation)
