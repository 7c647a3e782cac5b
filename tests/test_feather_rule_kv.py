"""Invariants of Feather's router under random traffic: it never routes a request to a
replica without KV for the request's life while another has it, and with nothing shared it
keeps every queue within its balance bound."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from feather_sched.cost.step_model import StepCostModel
from feather_sched.routing.base import RoutingRequest, pick
from feather_sched.routing.feather_rule import FeatherRule

REPLICAS = ["a", "b", "c"]
COST = StepCostModel("h200", "llama-3.1-8b")

# an operation: (finish an outstanding request?, its prefix id, prompt chunks, output tokens)
OPS = st.lists(
    st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 40), st.integers(1, 300)),
    min_size=1,
    max_size=60,
)


def _request(i: int, prefix: int, chunks: int, out: int) -> RoutingRequest:
    shared = np.full(64 * min(chunks, 8), 1000 + prefix, dtype=np.int32)
    own = np.arange(64 * chunks, dtype=np.int32) + 10_000 * (i + 1)
    return RoutingRequest(f"r{i}", tokens=np.concatenate([shared, own]), max_tokens=out)


@settings(max_examples=60, deadline=None)
@given(OPS, st.integers(2_000, 20_000))
def test_never_routes_where_the_request_cannot_live_if_another_can(ops, kv):
    rule = FeatherRule(COST, kv_tokens=kv)
    loads = dict.fromkeys(REPLICAS, 0)
    out: list[tuple[str, str]] = []
    for i, (finish, prefix, chunks, tokens) in enumerate(ops):
        if finish and out:
            rid, where = out.pop(0)
            rule.on_finished(rid, where, float(i), tokens)
            loads[where] -= 1
            continue
        req = _request(i, prefix, chunks, tokens)
        fits = {r for r in REPLICAS if rule.pricer.fits(req, r, float(i))}
        chosen = pick(rule.rank(req, REPLICAS, loads, float(i)), loads)
        if fits:
            assert chosen in fits
        rule.on_routed(req, chosen, float(i))
        loads[chosen] += 1
        out.append((req.request_id, chosen))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40)), min_size=1, max_size=80))
def test_unshared_traffic_stays_within_the_balance_bound(ops):
    rule = FeatherRule(COST)
    loads = dict.fromkeys(REPLICAS, 0)
    out: list[tuple[str, str]] = []
    for i, (finish, chunks) in enumerate(ops):
        if finish and out:
            rid, where = out.pop(0)
            rule.on_finished(rid, where, float(i), 16)
            loads[where] -= 1
            continue
        prompt = np.arange(64 * chunks, dtype=np.int32) + 100_000 * (i + 1)
        req = RoutingRequest(f"r{i}", tokens=prompt, max_tokens=16)
        cap = math.ceil(rule.balance * (sum(loads.values()) + 1) / len(REPLICAS))
        chosen = pick(rule.rank(req, REPLICAS, loads, float(i)), loads)
        assert loads[chosen] + 1 <= cap + len(REPLICAS)  # the bound, with its slack
        rule.on_routed(req, chosen, float(i))
        loads[chosen] += 1
        out.append((req.request_id, chosen))
