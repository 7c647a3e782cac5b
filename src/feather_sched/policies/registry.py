"""Policies by name: the one place the CLI, the simulator and the engine adapters look them up."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from feather_sched.policies.base import Policy

# name -> "module:Class"; imported lazily so optional policies cost nothing until used.
_POLICIES: dict[str, str] = {
    "fcfs": "feather_sched.policies.fcfs:FCFSPolicy",
    "lpm": "feather_sched.policies.sglang_baselines:LPMPolicy",
    "dfs-weight": "feather_sched.policies.sglang_baselines:DFSWeightPolicy",
    "hrrn": "feather_sched.policies.sglang_baselines:HRRNPolicy",
    "shortest-prefill-first": "feather_sched.policies.sglang_baselines:ShortestPrefillFirstPolicy",
    "lof": "feather_sched.policies.sglang_baselines:LOFPolicy",
    "random": "feather_sched.policies.sglang_baselines:RandomPolicy",
    "max-homogeneous": "feather_sched.policies.homogeneous:MaxHomogeneousPolicy",
    "grouped": "feather_sched.policies.grouped:GroupedPolicy",
    "feather": "feather_sched.policies.feather:FeatherPolicy",
    "feather-paper": "feather_sched.policies.feather_paper:FeatherPaperPolicy",
    "feather-ppo": "feather_sched.policies.feather_ppo:FeatherPPOPolicy",
}


def policy_names() -> list[str]:
    return list(_POLICIES)


def register_policy(name: str, target: str) -> None:
    """Make a policy available by name ("module:Class"), e.g. from a plugin."""
    _POLICIES[name] = target


def policy_class(name: str) -> Callable[..., Policy]:
    try:
        target = _POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; valid policies: {', '.join(_POLICIES)}"
        ) from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def make_policy(name: str, **kwargs) -> Policy:
    """A fresh policy instance; kwargs are the policy's own options (e.g. seed, max_batch)."""
    return policy_class(name)(**kwargs)
