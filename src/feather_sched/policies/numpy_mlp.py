"""A small policy network run in numpy: a decision costs microseconds and needs no torch.

The trained PPO actor is a few dense layers (tanh between them) ending in ADD/STOP logits.
Its weights live in an .npz (a few KB) with the observation feature names it was trained on,
so a network trained for another observation layout fails loudly at load time instead of
deciding on misread inputs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["NumpyMLP"]

# In place: a fresh temporary per call costs as much as the arithmetic at these sizes.
_ACTIVATIONS = {
    "tanh": lambda x: np.tanh(x, out=x),
    "relu": lambda x: np.maximum(x, 0.0, out=x),
}


class NumpyMLP:
    """Dense layers `x @ W + b`, `activation` between them, logits out."""

    def __init__(
        self,
        weights: Sequence[np.ndarray],
        biases: Sequence[np.ndarray],
        activation: str = "tanh",
        features: Sequence[str] = (),
        meta: dict | None = None,
    ) -> None:
        if not weights or len(weights) != len(biases):
            raise ValueError("need one bias per weight matrix, and at least one layer")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; valid: {sorted(_ACTIVATIONS)}")
        self.weights = [np.ascontiguousarray(w, dtype=np.float32) for w in weights]
        self.biases = [np.ascontiguousarray(b, dtype=np.float32) for b in biases]
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if w.ndim != 2 or b.shape != (w.shape[1],):
                raise ValueError(f"layer {i}: weight {w.shape} and bias {b.shape} do not fit")
            if i and w.shape[0] != self.weights[i - 1].shape[1]:
                raise ValueError(
                    f"layer {i} takes {w.shape[0]} inputs, gets {self.weights[i - 1].shape[1]}"
                )
        self.activation = activation
        self._act = _ACTIVATIONS[activation]
        # Two-way heads decide on one logit difference: STOP iff its logit is strictly larger
        # (argmax picks the first on ties), one dot product instead of a matmul and an argmax.
        self._pairs = list(zip(self.weights[:-1], self.biases[:-1]))
        if self.out_dim == 2:
            self._diff_w = np.ascontiguousarray(self.weights[-1][:, 1] - self.weights[-1][:, 0])
            self._diff_b = float(self.biases[-1][1] - self.biases[-1][0])
        self.features = tuple(features)
        self.meta = dict(meta or {})

    @property
    def in_dim(self) -> int:
        return self.weights[0].shape[0]

    @property
    def out_dim(self) -> int:
        return self.weights[-1].shape[1]

    def logits(self, obs: np.ndarray) -> np.ndarray:
        """Logits for one observation (shape (in,)) or a batch (shape (n, in))."""
        h = np.asarray(obs, dtype=np.float32)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = h @ w + b
            if i < last:
                h = self._act(h)
        return h

    def act(self, obs: np.ndarray) -> int:
        """The most likely action for one observation (as PPO's deterministic `predict`)."""
        if self.out_dim != 2:
            return int(np.argmax(self.logits(obs)))
        # `.dot` on 1-D float32 arrays dispatches faster than `@`
        h = obs
        act = self._act
        for w, b in self._pairs:
            h = h.dot(w)
            h += b
            act(h)
        return 1 if float(h.dot(self._diff_w)) + self._diff_b > 0.0 else 0

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            arrays[f"w{i}"] = w
            arrays[f"b{i}"] = b
        arrays["activation"] = np.array(self.activation)
        arrays["features"] = np.array(self.features, dtype=str)
        arrays["meta"] = np.array(json.dumps(self.meta, sort_keys=True))
        with path.open("wb") as f:  # a file object: np.savez would append ".npz" to a str
            np.savez_compressed(f, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path, expect_features: Sequence[str] | None = None) -> NumpyMLP:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"policy weights not found: {path}")
        try:
            with np.load(path, allow_pickle=False) as data:
                n = sum(1 for k in data.files if k.startswith("w"))
                weights = [data[f"w{i}"] for i in range(n)]
                biases = [data[f"b{i}"] for i in range(n)]
                activation = str(data["activation"])
                features = [str(f) for f in data["features"]]
                meta = json.loads(str(data["meta"])) if "meta" in data.files else {}
        except (KeyError, ValueError, OSError) as err:
            raise ValueError(f"{path}: not a feather policy-weights .npz ({err})") from None
        if expect_features is not None and tuple(features) != tuple(expect_features):
            raise ValueError(
                f"{path}: trained on observation features {features}, "
                f"this version observes {list(expect_features)}; retrain with `feather train`"
            )
        return cls(weights, biases, activation, features, meta)
