"""Caps, not lengths: what the scheduler sees of an output, and how it prices one it cannot
know (`policies.output_estimate`, the KV gate), with the simulator's books kept."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.sim.state import scheduler_request
from feather_lab.workloads import DocumentQAWorkload
from feather_lab.workloads.caps import CLIENT_CAPS, client_cap
from feather_sched import Request
from feather_sched.cost import StepCostModel
from feather_sched.policies.base import SchedulerView
from feather_sched.policies.fcfs import FCFSPolicy
from feather_sched.policies.kv_gate import KvGate
from feather_sched.policies.output_estimate import MIN_SEEN, WINDOW, OutputEstimate
from feather_sched.policies.registry import make_policy

COST = StepCostModel("h100", "llama-3.1-8b")


def test_request_cap_defaults_to_the_output_and_bounds_it() -> None:
    r = Request("a", [1, 2], 64)
    assert (r.max_tokens, r.ignore_eos) == (64, False)
    assert Request("b", [1], 64, max_tokens=256).max_tokens == 256
    with pytest.raises(ValueError, match="max_tokens must be >= output_len"):
        Request("c", [1], 64, max_tokens=63)
    with pytest.raises(ValueError, match="ignore_eos"):
        Request("d", [1], 64, max_tokens=128, ignore_eos=True)


@given(st.integers(1, 20_000))
def test_client_cap_is_a_default_with_headroom(output: int) -> None:
    cap = client_cap(output)
    assert cap >= output
    assert cap in CLIENT_CAPS or cap == output
    if 2 * output <= CLIENT_CAPS[-1]:
        assert cap >= 2 * output


def test_generators_draw_caps_and_ignore_eos_makes_them_firm() -> None:
    shape = {"num_documents": 2, "document_len": 64, "questions_per_document": 3}
    capped = DocumentQAWorkload(**shape, output_len=64).generate(0)
    assert {(r.max_tokens, r.ignore_eos) for r in capped} == {(256, False)}
    firm = DocumentQAWorkload(**shape, output_len=64, ignore_eos=True).generate(0)
    assert {(r.max_tokens, r.ignore_eos) for r in firm} == {(64, True)}
    assert all(np.array_equal(a.prompt, b.prompt) for a, b in zip(capped, firm, strict=True))


def test_scheduler_request_shows_the_cap_unless_exact_or_ignore_eos() -> None:
    r = Request("a", [1, 2, 3], 40, meta={"k": 1}, max_tokens=256)
    seen = scheduler_request(r, "cap")
    assert (seen.output_len, seen.meta, seen.prompt_len) == (256, {"k": 1, "firm_output": False}, 3)
    assert r.meta == {"k": 1}  # the workload's own request is untouched
    assert scheduler_request(r, "exact") is r
    firm = Request("b", [1], 40, ignore_eos=True)
    assert scheduler_request(firm, "cap") is firm


def test_estimate_waits_for_enough_outputs_then_prices_from_them() -> None:
    est = OutputEstimate()
    for _ in range(MIN_SEEN - 1):
        est.observe(64, 256)
    assert not est.ready and est.expected(256) == 256.0
    est.observe(64, 256)
    assert est.ready and est.expected(512) == pytest.approx(128.0)
    assert est.remaining(0, 256) == 64
    assert est.remaining(40, 256) == 24
    assert est.remaining(64, 256) == 192  # past every output seen: its whole cap
    assert est.remaining(256, 256) == 0


def test_estimate_takes_the_quantile_of_outputs_that_ran_as_far() -> None:
    est = OutputEstimate()
    for out in range(1, 101):  # shares 0.01 .. 1.00 of a 100-token cap
        est.observe(out, 100)
    assert est.remaining(0, 100) == 90  # the 0.9 quantile of all
    assert est.remaining(50, 100) == 95 - 50  # of the 50 that ran past 50: their 0.9 quantile
    assert est.remaining(99, 100) == 1


def test_estimate_keeps_a_window_and_reads_a_hosts_outputs_once() -> None:
    est = OutputEstimate()
    view = SimpleNamespace(finished_outputs=[(256, 256)] * WINDOW)
    est.update(view)
    assert est.remaining(0, 256) == 256
    view.finished_outputs += [(32, 256)] * WINDOW  # the old ones leave the window
    est.update(view)
    est.update(view)
    assert est.remaining(0, 256) == 32 and est.expected(256) == pytest.approx(32.0)


class _View(SimpleNamespace):
    def running_kv(self) -> Iterator[tuple[int, int, int, bool, int]]:
        return iter(self.running)

    def request(self, rid: str) -> Request:
        return self.requests[rid]

    def cached_blocks(self, rid: str) -> int:
        return 0


def test_gate_prices_a_capped_output_from_the_run() -> None:
    """64-token prompt, a 1,024-token cap: before outputs finish the gate holds SGLang's ratio
    of the cap; once the run has seen 64-token answers it holds 64 tokens and admits."""
    cand = Request("c", [1] * 64, 1024, meta={"firm_output": False})
    running = [(80, 0, 1024 - 16, False, 16)]  # 16 of a 1,024 cap decoded
    est = OutputEstimate()
    gate = KvGate(est)

    def fits(free: int) -> bool:
        view = _View(free_kv_blocks=free, num_preemptions=0, block_size=16, running=running,
                     requests={"c": cand})  # fmt: skip
        gate.begin_step(view)
        return gate.fits(view, "c")

    assert not fits(20)
    for _ in range(MIN_SEEN):
        est.observe(64, 1024)
    # running: 48 tokens to go (3 blocks, freed at its end); candidate: 4 prompt + 4 output
    # blocks; the peak, just before the running one finishes: 4 + 2 x 3 blocks
    assert fits(10)
    assert not fits(9)


class _Spy(FCFSPolicy):
    """FCFS that records what each request's output looks like to the scheduler."""

    def __init__(self) -> None:
        super().__init__()
        self.saw: dict[str, tuple[int, bool]] = {}

    def begin_step(self, view: SchedulerView) -> None:
        for rid in view.waiting_ids():
            r = view.request(rid)
            self.saw[rid] = (r.output_len, r.meta.get("firm_output", True))


@pytest.mark.parametrize("sees", ["cap", "exact"])
def test_the_simulators_scheduler_sees_caps_or_lengths(sees: str) -> None:
    reqs = [Request("a", [1] * 40, 8, max_tokens=256), Request("b", [2] * 40, 8, ignore_eos=True)]
    spy = _Spy()
    cfg = EngineConfig(scheduler_sees_output=sees)
    result = simulate(reqs, spy, COST, cfg)
    assert result.output_tokens == 16
    assert spy.saw == {"a": (256 if sees == "cap" else 8, sees == "exact"), "b": (8, True)}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    n=st.integers(1, 24),
    blocks=st.integers(14, 40),
    policy=st.sampled_from(["fcfs", "feather", "vllm-cache-aware"]),
    sees=st.sampled_from(["cap", "exact"]),
)
def test_capped_workloads_finish_every_request_once(
    data: st.DataObject, n: int, blocks: int, policy: str, sees: str
) -> None:
    """Never drop, never duplicate: with caps above the outputs (or ignore_eos), under KV
    pressure, every request finishes once with its true output."""
    bases = [np.random.default_rng(i).integers(0, 50, 120).astype(np.int32) for i in range(3)]
    reqs = []
    for i in range(n):
        base, cut = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 120))
        tail = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=40))
        out = data.draw(st.integers(1, 12))
        eos = data.draw(st.booleans())
        cap = None if eos else out + data.draw(st.integers(0, 200))
        prompt = np.r_[bases[base][:cut], tail]
        arrival = data.draw(st.floats(0, 0.2))
        reqs.append(Request(f"r{i}", prompt, out, arrival, max_tokens=cap, ignore_eos=eos))
    options = {"hardware": "h100", "model": "llama-3.1-8b"} if policy == "feather" else {}
    cfg = EngineConfig(
        max_num_seqs=6, max_num_batched_tokens=64, num_kv_blocks=blocks,
        check_invariants_every=1, scheduler_sees_output=sees,
    )  # fmt: skip
    result = simulate(reqs, make_policy(policy, **options), COST, cfg)
    assert sorted(r.request_id for r in result.records) == sorted(r.request_id for r in reqs)
    assert {r.request_id: r.output_len for r in result.records} == {
        r.request_id: r.output_len for r in reqs
    }
