"""Feather's settings inside an engine: one typed, frozen object, read from the environment.

Every engine adapter (vLLM's scheduler class, SGLang's plugin) reads the same names with the
same units and defaults, when the engine builds its scheduler, so a bad value fails at
startup with the variable's name, before any request is served:

| variable | meaning | default |
|---|---|---|
| `FEATHER_POLICY` | a policy from `feather_sched.policies.registry`, or `off` | `feather` |
| `FEATHER_POLICY_OPTIONS` | JSON object of the policy's keyword options | `{}` |
| `FEATHER_CHUNK_TOKENS` | CHT chunk, in prompt tokens (vLLM: whole KV blocks) | 64 |
| `FEATHER_POLICY_STATE` | file of the policy's learned state: loaded, then saved | none |
| `FEATHER_POLICY_STATE_EVERY_S` | seconds between saves of that state | 60 |

Why 64 tokens: a shared prefix shorter than one chunk is not grouped, and an arrival hashes
(or copies) one digest per chunk, so a coarser chunk is cheaper to insert; admissions, finishes
and the scheduler's queries no longer depend on it (they touch one CHT node per divergence
point of a prompt, not one key per chunk: benchmarks/cht/README.md). 64 is the chunk every
simulator result in benchmarks/ was measured with. vLLM's chunk is a whole
number of its KV blocks (the CHT reuses vLLM's block hashes instead of hashing the prompt).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feather_sched.policies.base import Policy
from feather_sched.policies.registry import make_policy, policy_names

__all__ = ["ENV", "FeatherSettings", "PolicyStateSaver", "SettingsError"]

logger = logging.getLogger("feather_sched")

ENV = {
    "policy": "FEATHER_POLICY",
    "policy_options": "FEATHER_POLICY_OPTIONS",
    "chunk_tokens": "FEATHER_CHUNK_TOKENS",
    "policy_state": "FEATHER_POLICY_STATE",
    "policy_state_every_s": "FEATHER_POLICY_STATE_EVERY_S",
}
"""Setting -> its environment variable (the only names Feather reads)."""

OFF = frozenset({"off", "none", "false", "0"})
DEFAULT_POLICY = "feather"
DEFAULT_CHUNK_TOKENS = 64
DEFAULT_STATE_EVERY_S = 60.0


class SettingsError(ValueError):
    """A Feather environment variable holds a value that cannot be used."""


@dataclass(frozen=True)
class FeatherSettings:
    """What runs inside the engine. `policy=None` means Feather is off."""

    policy: str | None = DEFAULT_POLICY
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    policy_state: Path | None = None
    policy_state_every_s: float = DEFAULT_STATE_EVERY_S

    @property
    def enabled(self) -> bool:
        return self.policy is not None

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, default_policy: str | None = DEFAULT_POLICY
    ) -> FeatherSettings:
        """Read and check every setting. `default_policy` applies when `FEATHER_POLICY` is
        unset (an engine may pass None: installed is not enabled)."""
        env = os.environ if environ is None else environ

        def raw(name: str) -> str:
            return env.get(ENV[name], "").strip()

        policy = _policy(raw("policy"), default_policy)
        state = raw("policy_state")
        return cls(
            policy=policy,
            policy_options=_options(raw("policy_options")),
            chunk_tokens=int(_number("chunk_tokens", raw("chunk_tokens"), DEFAULT_CHUNK_TOKENS)),
            policy_state=Path(state) if state else None,
            policy_state_every_s=_number(
                "policy_state_every_s", raw("policy_state_every_s"), DEFAULT_STATE_EVERY_S
            ),
        )

    def make_policy(self) -> Policy:
        """The configured policy, warm from `policy_state` when that file exists."""
        if self.policy is None:
            raise SettingsError(f"{ENV['policy']} is off: there is no policy to build")
        options = dict(self.policy_options)
        if self.policy_state is not None and self.policy_state.is_file():
            options.setdefault("policy_state", str(self.policy_state))
        try:
            policy = make_policy(self.policy, **options)
        except (KeyError, TypeError, ValueError) as err:
            raise SettingsError(
                f"{ENV['policy']}={self.policy!r} with {ENV['policy_options']}="
                f"{json.dumps(dict(self.policy_options))}: {err}"
            ) from err
        if self.policy_state is not None and not keeps_state(policy):
            raise SettingsError(
                f"{ENV['policy_state']} is set but policy {self.policy!r} keeps no learned state"
            )
        return policy

    def state_saver(self) -> PolicyStateSaver | None:
        """Saves the policy's learned state while serving, when `policy_state` is set."""
        if self.policy_state is None:
            return None
        return PolicyStateSaver(self.policy_state, self.policy_state_every_s)


def _policy(raw: str, default: str | None) -> str | None:
    if not raw:
        return default
    if raw.lower() in OFF:
        return None
    if raw not in policy_names():
        raise SettingsError(
            f"{ENV['policy']}={raw!r} is not a policy; valid: {', '.join(policy_names())}, off"
        )
    return raw


def _options(raw: str) -> dict[str, Any]:
    try:
        options = json.loads(raw) if raw else {}
    except json.JSONDecodeError as err:
        raise SettingsError(f"{ENV['policy_options']} is not valid JSON: {err}") from None
    if not isinstance(options, dict):
        raise SettingsError(f"{ENV['policy_options']} must be a JSON object, got {raw!r}")
    return options


def _number(name: str, raw: str, default: float) -> float:
    """A positive number (an integer where the default is one)."""
    if not raw:
        return default
    kind = int if isinstance(default, int) else float
    try:
        value = kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise SettingsError(f"{ENV[name]} must be {what}, got {raw!r}") from None
    if value <= 0:
        raise SettingsError(f"{ENV[name]} must be > 0, got {raw!r}")
    return value


def keeps_state(policy: Policy) -> bool:
    """Policies with learned state save it with `save(path)` (the feather bandit)."""
    return callable(getattr(policy, "save", None))


class PolicyStateSaver:
    """Saves a policy's learned state to a file every `every_s` seconds (checked once per
    engine step, so the cost is a clock read) and on demand. A failed save is logged, never
    raised: serving must not stop because a disk is full."""

    def __init__(
        self, path: Path, every_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.every_s = every_s
        self._clock = clock
        self._last = clock()
        self.saves = 0

    def maybe_save(self, policy: Policy) -> None:
        if self._clock() - self._last >= self.every_s:
            self.save(policy)

    def save(self, policy: Policy) -> None:
        self._last = self._clock()
        if not keeps_state(policy):
            return  # a stateless policy was swapped in at run time: nothing to keep
        try:
            policy.save(self.path)  # type: ignore[attr-defined]
            self.saves += 1
        except Exception:
            logger.exception("feather: could not save the policy state to %s", self.path)
