"""Policies by name: the one place the CLI, the simulator and the engine adapters look them up."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from feather_sched.cost.resolve import COST_NAMES, cost_options
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
    "vllm-cache-aware": "feather_sched.policies.vllm_cache_aware:VllmCacheAwarePolicy",
    "max-homogeneous": "feather_sched.policies.homogeneous:MaxHomogeneousPolicy",
    "grouped": "feather_sched.policies.grouped:GroupedPolicy",
    "feather": "feather_sched.policies.feather:FeatherPolicy",
    "feather-hold": "feather_sched.policies.feather:FeatherHoldPolicy",
    "feather-paper": "feather_sched.policies.feather_paper:FeatherPaperPolicy",
    "feather-upstream": "feather_sched.policies.feather_upstream:FeatherUpstreamPolicy",
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


def make_policy(name: str, **kwargs: Any) -> Policy:
    """A fresh policy instance; kwargs are the policy's own options (e.g. seed, max_batch).

    Policies take a cost model object (`cost`), but options given by name often come as
    text (a JSON environment variable, a bench record, a Ray Serve deployment's options):
    for a policy that takes `cost`, profile names (`hardware`, `model`, `kernel`) become
    the cost model here (`cost.resolve.cost_options`), the one edge where they do."""
    cls = policy_class(name)
    if any(k in kwargs for k in COST_NAMES) and _takes_cost(cls):
        kwargs = cost_options(kwargs)
    return cls(**kwargs)


def _takes_cost(cls: Callable[..., Policy]) -> bool:
    """Whether a policy's constructor takes a cost model (a policy that does not keeps its
    own error for a profile name it was given)."""
    try:
        return "cost" in inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no signature to read: pass the options as given
        return False
