"""Real Ray Serve: a local app of 3 emulated engine replicas behind FeatherRequestRouter and
behind Ray's own routers (extra `ray`; run with `pytest -m ray`).

The replicas are `EmulatedEngine`s: the simulator's engine played out in wall-clock time from
the cost model (no model weights), so the test exercises Ray's real routing path (handle,
router, replica actors, completion callbacks) on a CPU machine.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from requires import require

pytestmark = pytest.mark.ray

ray = require("ray", "ray", "needs Ray Serve: pip install -e '.[ray]'")
serve = require("ray.serve", "ray", "needs Ray Serve: pip install -e '.[ray]'")

from ray.serve.config import RequestRouterConfig  # noqa: E402

from feather_lab.harness.ray_emulated import EmulatedEngine  # noqa: E402
from feather_sched.ray.router import CompletionRequest, FeatherRequestRouter  # noqa: E402
from serve_helpers import check_exactly_once, send_all  # noqa: E402

RAY_PREFIX_ROUTER = (
    "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:"
    "PrefixCacheAffinityRouter"
)


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    serve.shutdown()
    ray.shutdown()


def _workload(groups: int = 6, per_group: int = 8, prefix: int = 2048, seed: int = 0):
    """Text prompts (Ray Serve LLM's router reads text): `groups` shared 2,048-character
    heads, a 64-character question each, shuffled."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz "))

    def text(n: int) -> str:
        return "".join(rng.choice(letters, n))

    heads = [text(prefix) for _ in range(groups)]
    reqs = [
        (g, CompletionRequest(f"g{g}-q{q}", prompt=heads[g] + text(64), max_tokens=16))
        for g in range(groups)
        for q in range(per_group)
    ]
    return [reqs[i] for i in rng.permutation(len(reqs))]


def _app(name: str, router_config: RequestRouterConfig | None, time_scale: float = 1.0):
    opts = {
        "name": name,
        "num_replicas": 3,
        "max_ongoing_requests": 1000,
        "ray_actor_options": {"num_cpus": 0},
    }
    if router_config is not None:
        opts["request_router_config"] = router_config
    dep = serve.deployment(EmulatedEngine).options(**opts)
    return serve.run(dep.bind(policy="fcfs", time_scale=time_scale), name=name, route_prefix=None)


def _check_exactly_once(answers, reqs) -> None:
    check_exactly_once(answers, {r.request_id: r.max_tokens for _, r in reqs})


def test_feather_router_routes_and_groups(ray_local):
    cfg = RequestRouterConfig(
        request_router_class=FeatherRequestRouter,
        request_router_kwargs={"balance": 1.2, "chunk_tokens": 64},
    )
    handle = _app("feather", cfg)
    assert issubclass(FeatherRequestRouter, serve.request_router.RequestRouter)
    reqs = _workload()
    answers, _ = send_all(handle, reqs)
    _check_exactly_once(answers, reqs)
    group_of = {r.request_id: g for g, r in reqs}
    homes: dict[int, set] = {}
    per_replica: dict[str, int] = {}
    for rid, (a,) in answers.items():
        homes.setdefault(group_of[rid], set()).add(a["replica"])
        per_replica[a["replica"]] = per_replica.get(a["replica"], 0) + 1
    # every replica serves, none more than the balance bound allows (+ its slack)
    assert len(per_replica) == 3
    assert max(per_replica.values()) <= 1.2 * len(reqs) / 3 + 1 + 3  # ceil + slack
    # a prefix group stays on few replicas (pow2 would spray each over all 3)
    assert np.mean([len(h) for h in homes.values()]) <= 1.5
    serve.delete("feather")


@pytest.mark.parametrize("router", ["pow2", "prefix-affinity"])
def test_ray_routers_route_and_complete(ray_local, router):
    cfg = None
    if router == "prefix-affinity":
        cfg = RequestRouterConfig(request_router_class=RAY_PREFIX_ROUTER)
    handle = _app(f"ray-{router}", cfg)
    reqs = _workload(groups=3, per_group=6)
    answers, _ = send_all(handle, reqs)
    _check_exactly_once(answers, reqs)
    serve.delete(f"ray-{router}")


def test_feather_router_survives_a_replica_dying(ray_local):
    cfg = RequestRouterConfig(request_router_class=FeatherRequestRouter)
    # slow replicas (10x the modelled time) so the kill lands mid-run
    handle = _app("dying", cfg, time_scale=10.0)
    reqs = _workload(groups=6, per_group=8, seed=1)

    def kill_one():
        time.sleep(0.5)
        names = [
            a
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::dying")
        ]
        assert names, "no replica actors found"
        victim = ray.get_actor(names[0]["name"], namespace=names[0]["namespace"])
        ray.kill(victim, no_restart=True)

    answers, retried = send_all(handle, reqs, retries=3, on_sent=kill_one)
    _check_exactly_once(answers, reqs)
    assert retried > 0, "the kill landed after every request finished"
    serve.delete("dying")


def test_prefix_tree_port_agrees_with_rays_tree():
    """routing.prefix_tree is a port of Ray's PrefixTree: same matches, same tenant sizes."""
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import (
        PrefixTree as RayTree,
    )

    from feather_sched.routing.prefix_tree import PrefixTree

    rng = np.random.default_rng(3)
    ours, theirs = PrefixTree(), RayTree()
    tenants = ["a", "b", "c"]
    ours.add_tenants(tenants, 0)
    theirs.add_tenants(tenants, 0)
    heads = ["".join(rng.choice(list("xyz"), 12)) for _ in range(5)]
    for i in range(300):
        text = heads[rng.integers(5)] + "".join(rng.choice(list("xyz"), rng.integers(0, 8)))
        avail = list(rng.choice(tenants, rng.integers(1, 4), replace=False))
        assert ours.prefix_match(text, avail) == theirs.prefix_match(text, avail)
        tenant = tenants[rng.integers(3)]
        ours.insert(text, tenant, i)
        theirs.insert(text, tenant, i)
        assert ours.tenant_to_char_count == theirs.tenant_to_char_count
        assert ours.get_smallest_tenants() == theirs.get_smallest_tenants()
