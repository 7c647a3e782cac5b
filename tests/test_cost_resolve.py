"""Profile names to a cost model (`cost.resolve`): the one rule of `--feather-hardware`, the
errors a bad name gets, and the by-name edges (make_policy, make_rule) that take text."""

from __future__ import annotations

import pytest

from feather_lab.bench.suite import BenchSpec
from feather_sched.cost import StepCostModel, cost_options, prior_cost, resolve_cost
from feather_sched.cost.resolve import prior_hardware
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.registry import make_policy
from feather_sched.routing.feather_rule import FeatherRule, feather_rule
from feather_sched.routing.rules import make_rule


def test_resolve_cost_names_the_bad_value_and_the_valid_ones() -> None:
    cost = resolve_cost("h100", "llama-3-8b", "ideal")
    assert (cost.hardware.name, cost.model.name, cost.kernel.value) == (
        "h100",
        "llama-3-8b",
        "ideal",
    )
    with pytest.raises(ValueError, match=r"unknown hardware profile 'tpu9'; valid names: .*h100"):
        resolve_cost("tpu9", "llama-3-8b")
    with pytest.raises(ValueError, match="unknown kernel 'warp'; valid: paged, ideal"):
        resolve_cost("h100", "llama-3-8b", "warp")


def test_feather_hardware_has_one_rule() -> None:
    """Unset: the run's own hardware (none for a real engine); 'none': no prior."""
    assert prior_hardware(None, "h200") == "h200"
    assert prior_hardware("cpu", "h200") == "cpu"
    assert prior_hardware("none", "h200") is None
    assert prior_hardware(None, None) is None  # a real engine's run: no profile of its own
    assert prior_cost("none", "h200", "llama-3.1-8b") is None
    spec = BenchSpec(hardware="h100", kernel="ideal")
    assert repr(spec.feather_cost()) == repr(StepCostModel("h100", "llama-3.1-8b", "ideal"))
    assert BenchSpec(feather_hardware="none").feather_cost() is None
    with pytest.raises(ValueError, match="--feather-hardware bogus: unknown hardware profile"):
        BenchSpec(feather_hardware="bogus").feather_cost()


def test_costs_resolve_the_prior_only_where_feather_runs() -> None:
    assert BenchSpec(policies=("fcfs",), feather_hardware="bogus").costs().feather is None
    costs = BenchSpec(policies=("feather",), feather_hardware="cpu", model="tiny-llama").costs()
    assert costs.feather is not None and costs.feather.hardware.name == "cpu"
    assert costs.run.hardware.name == "h200"


def test_cost_options_turn_names_into_a_cost_model() -> None:
    out = cost_options({"alpha": 0.2, "hardware": "h100", "model": "llama-3-8b"})
    assert out["alpha"] == 0.2 and "hardware" not in out and "model" not in out
    assert isinstance(out["cost"], StepCostModel) and out["cost"].hardware.name == "h100"
    assert cost_options({"alpha": 0.2}) == {"alpha": 0.2, "cost": None}
    assert cost_options({"kernel": "ideal"})["cost"] is None  # no profiles: no cost model
    given = StepCostModel("h100", "llama-3-8b")
    assert cost_options({"cost": given})["cost"] is given
    with pytest.raises(ValueError, match="both or neither"):
        cost_options({"model": "llama-3-8b"})
    with pytest.raises(ValueError, match="not both"):
        cost_options({"cost": given, "hardware": "h100"})
    defaulted = cost_options({"hardware": "h200"}, hardware="h100", model="llama-3.1-8b")
    assert defaulted["cost"].hardware.name == "h200" and defaulted["cost"].model.name == (
        "llama-3.1-8b"
    )


def test_make_policy_takes_names_at_its_edge() -> None:
    policy = make_policy("feather", hardware="h100", model="llama-3-8b", kernel="ideal")
    assert isinstance(policy, FeatherPolicy) and policy.cost is not None
    assert policy.cost.kernel.value == "ideal"
    assert make_policy("feather").cost is None
    with pytest.raises(ValueError, match="unknown hardware profile 'bogus'"):
        make_policy("feather", hardware="bogus", model="llama-3-8b")
    with pytest.raises(TypeError):  # a policy without a cost model: its own error, as before
        make_policy("fcfs", hardware="bogus")


def test_feather_rule_takes_a_cost_model_and_names_at_its_edge() -> None:
    cost = StepCostModel("h200", "llama-3.1-8b")
    assert FeatherRule(cost).drain.cost is cost
    default = make_rule("feather")
    assert isinstance(default, FeatherRule)
    assert repr(default.drain.cost) == repr(StepCostModel("h100", "llama-3.1-8b", "paged"))
    named = feather_rule(hardware="h200", balance=1.5)
    assert named.drain.cost.hardware.name == "h200" and named.balance == 1.5
    assert named.drain.cost.model.name == "llama-3.1-8b"
