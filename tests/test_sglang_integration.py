"""Feather inside SGLang's real scheduling classes (sglang 0.5.x on CPU, extra 'sglang').

Real `Req`, `RadixCache`, `TokenToKVPoolAllocator`, `SchedulePolicy` and `PrefillAdder`; the
plugin is loaded through SGLang's own `load_plugins()` from the installed entry point. The
`Engine` below is the slice of `Scheduler._get_new_batch_prefill_raw`
(sglang/srt/managers/scheduler.py) that forms a prefill batch, calling the patched
`Scheduler.get_prefill_adder_class` unbound on it, so no model or GPU is needed.
"""

from __future__ import annotations

import importlib
import json
import os
import random
from array import array
from collections import Counter

import pytest

from feather_sched.index.cht import RequestState
from feather_sched.sglang.cpu import prepare_cpu_import

pytestmark = pytest.mark.sglang

PREFIX_LEN = 128
TAIL_LEN = 16


def _require(module: str):
    """Import an SGLang module, or skip (FEATHER_REQUIRE_SGLANG=1 makes it a failure, for CI)."""
    prepare_cpu_import()
    if os.environ.get("FEATHER_REQUIRE_SGLANG") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(
        module, reason="SGLang is not installed (see the 'sglang' extra in pyproject.toml)"
    )


@pytest.fixture(scope="module")
def sg():
    """SGLang imported, its config published as its own tests do, and plugins loaded."""
    sp = _require("sglang.srt.managers.schedule_policy")
    from sglang.srt.managers import scheduler as scheduler_mod
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    reset_context()
    publish(
        ServerArgs(model_path="dummy", device="cpu"),
        role="test",
        ranks=SpawnRanks(world_rank=0, dp_rank=None),
    )
    originals = {
        "calc_priority": sp.SchedulePolicy.calc_priority,
        "get_prefill_adder_class": scheduler_mod.Scheduler.get_prefill_adder_class,
    }
    saved = {k: os.environ.get(k) for k in ("SGLANG_PLUGINS", "FEATHER_POLICY")}
    os.environ.pop("SGLANG_PLUGINS", None)
    os.environ["FEATHER_POLICY"] = "grouped"
    try:
        load_plugins()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    class NS:
        pass

    ns = NS()
    ns.sp, ns.Scheduler, ns.Req, ns.ScheduleBatch = sp, scheduler_mod.Scheduler, Req, ScheduleBatch
    ns.TokenToKVPoolAllocator, ns.RadixCache, ns.SamplingParams = (
        TokenToKVPoolAllocator,
        RadixCache,
        SamplingParams,
    )
    ns.originals = originals
    yield ns
    reset_context()


@pytest.fixture
def feather_on(monkeypatch):
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.delenv("FEATHER_POLICY_OPTIONS", raising=False)
    monkeypatch.setenv("FEATHER_POLICY", "grouped")
    monkeypatch.setenv("FEATHER_CHUNK_TOKENS", "32")
    return monkeypatch


PREFIXES = {g: [100 * (i + 1) + t for t in range(PREFIX_LEN)] for i, g in enumerate("ABCD")}


def make_req(sg, rid: str, group: str, tail: int = TAIL_LEN, seed: int = 0):
    rng = random.Random(f"{rid}/{seed}")
    ids = PREFIXES[group] + [rng.randrange(5000, 30000) for _ in range(tail)]
    return sg.Req(rid, "", array("q", ids), sg.SamplingParams(max_new_tokens=8))


def interleaved(sg, n: int, groups: str = "ABCD"):
    return [make_req(sg, f"{g}{i}", g) for i in range(n) for g in groups]


class Engine:
    """SGLang's prefill-batch formation on real objects (scheduler.py,
    `_get_new_batch_prefill_raw`): calc_priority, the adder from `get_prefill_adder_class`,
    the chunked request first, then `for req in self.waiting_queue` until a non-CONTINUE."""

    def __init__(
        self,
        sg,
        policy: str,
        *,
        kv_tokens=100_000,
        max_prefill_tokens=16384,
        chunked_prefill_size=8192,
        max_running_requests=64,
        enable_overlap=None,
    ):
        self.sg = sg
        if enable_overlap is not None:  # a real Scheduler always has it
            self.enable_overlap = enable_overlap
        self.alloc = sg.TokenToKVPoolAllocator(
            size=kv_tokens,
            dtype=__import__("torch").float16,
            device="cpu",
            kvcache=None,
            need_sort=False,
        )
        self.tree_cache = sg.RadixCache.create_simulated(mock_allocator=self.alloc)
        self.policy = sg.sp.SchedulePolicy(policy, self.tree_cache, False, False, False)
        self.running_batch = sg.ScheduleBatch(reqs=[])
        self.waiting_queue: list = []
        self.chunked_req = None
        self.page_size = 1
        self.max_prefill_tokens = max_prefill_tokens
        self.chunked_prefill_size = chunked_prefill_size
        self.max_running_requests = max_running_requests

    def step(self) -> list:
        """One batch formation and its prefill, through Feather's `get_next_batch_to_run`
        hook as SGLang's event loop calls it."""
        from feather_sched.sglang.plugin import around_next_batch

        return around_next_batch(lambda _: self._form_batch(), self)

    def _form_batch(self) -> list:
        sp = self.sg.sp
        if not self.waiting_queue and self.chunked_req is None:
            return []
        self.policy.calc_priority(self.waiting_queue, self.running_batch, processed_tokens=0)
        adder = self.sg.Scheduler.get_prefill_adder_class(self)(
            self.page_size,
            self.tree_cache,
            self.alloc,
            self.running_batch,
            0.5,
            self.max_prefill_tokens,
            self.chunked_prefill_size,
            0,
            0,
            max_running_requests=self.max_running_requests,
        )
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting_queue:
            held = len(self.running_batch.reqs) + len(adder.can_run_list)
            if held >= self.max_running_requests:  # get_num_allocatable_reqs
                break
            req.init_next_round_input(self.tree_cache)
            res = adder.add_one_req(
                req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None
            )
            if res != sp.AddReqResult.CONTINUE:
                break
        can_run = list(adder.can_run_list)
        taken = set(can_run)
        self.waiting_queue = [x for x in self.waiting_queue if x not in taken]
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        for r in can_run:  # the forward ran
            if r is self.chunked_req:
                r.prefix_len = r.extend_end  # mem_cache/common.py checkpoint_kv_cache
            elif r not in self.running_batch.reqs:  # get_next_batch_to_run merges it
                self.running_batch.reqs.append(r)
            self._cache_prefill(r)
        return can_run

    def _cache_prefill(self, r) -> None:
        """The prefill's tokens enter the radix tree, as SGLang's prefill result does
        (`RadixCache.cache_unfinished_req`): KV for the tokens it computed comes from the
        pool; what the tree already held is freed again."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        end = r.extend_end if r is self.chunked_req else len(r.origin_input_ids)
        value = self.alloc.alloc(end)
        if value is None:
            return  # the pool is full: nothing more is cached
        key = RadixKey(token_ids=r.origin_input_ids[:end], extra_key=r.extra_key)
        found = self.tree_cache.insert(InsertParams(key=key, value=value)).prefix_len
        self.alloc.free(value[:found])  # already in the tree: its KV is the tree's

    @property
    def running(self) -> list:
        return list(self.running_batch.reqs)


def rids(reqs) -> list[str]:
    return [r.rid for r in reqs]


# ---------------------------------------------------------------------------- installation
def test_entry_point_discovered_and_whitelist_respected(sg, monkeypatch):
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    from feather_sched.sglang.plugin import register

    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert found["feather"] == (register, "feather-sched")
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")
    assert "feather" not in load_plugins_by_group(GENERAL_PLUGINS_GROUP)


def test_plugin_hooks_are_applied(sg):
    from feather_sched.sglang.plugin import HOOK_TARGETS

    calc = sg.sp.SchedulePolicy.calc_priority
    adder = sg.Scheduler.get_prefill_adder_class
    assert calc.__wrapped__ is sg.originals["calc_priority"]
    assert adder.__wrapped__ is sg.originals["get_prefill_adder_class"]
    for target in HOOK_TARGETS:
        owner, name = target.rsplit(".", 1)
        cls = sg.sp.SchedulePolicy if "SchedulePolicy" in owner else sg.Scheduler
        assert hasattr(getattr(cls, name), "__wrapped__"), target


def test_register_does_nothing_when_off(sg, monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from feather_sched.sglang.plugin import register

    monkeypatch.setenv("FEATHER_POLICY", "off")
    before = {k: len(v) for k, v in HookRegistry._hooks.items()}
    register()
    assert {k: len(v) for k, v in HookRegistry._hooks.items()} == before


# ---------------------------------------------------------------------------- Feather on
def test_feather_order_reaches_the_batch(sg, feather_on):
    from feather_sched.sglang.plugin import queue_for

    def first_batch(env_policy: str) -> list[str]:
        feather_on.setenv("FEATHER_POLICY", env_policy)
        eng = Engine(sg, "fcfs", max_running_requests=5)
        eng.waiting_queue = [make_req(sg, "A-run", "A")]
        assert rids(eng.step()) == ["A-run"]
        eng.waiting_queue += interleaved(sg, 4)
        return rids(eng.step()), eng

    batch, eng = first_batch("grouped")
    assert batch == ["A0", "A1", "A2", "A3"]  # the running prefix group, oldest first
    q = queue_for(eng.policy)
    assert q.stats.admitted == 5 and q.stats.hashed == 17
    q.check(eng.waiting_queue, eng.running)
    off, _ = first_batch("off")
    assert off == ["A0", "B0", "C0", "D0"]  # SGLang's fcfs, unchanged


@pytest.mark.parametrize(
    ("chunk", "budget", "overlap"),
    [(8192, 8192, True), (None, 16384, False), (-1, 16384, None)],
)
def test_the_view_reports_the_schedulers_batch_limits(sg, feather_on, chunk, budget, overlap):
    """The adder hook reads the scheduler's limits into the policy's view (the judge of when
    grouped order can pay needs the token budget, and whether the loop overlaps its CPU with
    the GPU): a prefill batch computes at most `max_prefill_tokens`, and at most the chunk
    size when chunked prefill is on; `enable_overlap` says the loop."""
    from feather_sched.sglang.plugin import queue_for

    eng = Engine(
        sg, "fcfs", max_running_requests=7, chunked_prefill_size=chunk, enable_overlap=overlap
    )
    q = queue_for(eng.policy)
    assert q.max_num_batched_tokens is None  # until the scheduler builds an adder
    assert q.overlaps_cpu is None
    eng.waiting_queue = interleaved(sg, 1)
    eng.step()
    assert (q.max_num_seqs, q.max_num_batched_tokens) == (7, budget)
    assert q.overlaps_cpu is overlap


def test_feather_stop_reaches_the_batch(sg, feather_on):
    from feather_sched.sglang.plugin import queue_for

    feather_on.setenv("FEATHER_POLICY_OPTIONS", json.dumps({"max_batch": 3}))
    eng = Engine(sg, "fcfs")
    eng.waiting_queue = interleaved(sg, 3)
    # A1 waits a pass for A's prefix in the cache (skipped); the pass goes on in SGLang's
    # order, each request still asked: STOP at 3 though memory takes all 12
    assert rids(eng.step()) == ["A0", "B0", "C0"]
    assert queue_for(eng.policy).stats.stops == 1
    assert queue_for(eng.policy).stats.deferrals == 1
    assert eng.step() == []  # still 3 running: STOP before the first candidate
    feather_on.setenv("FEATHER_POLICY", "off")
    eng_off = Engine(sg, "fcfs")
    eng_off.waiting_queue = interleaved(sg, 3)
    assert len(eng_off.step()) == 12


def test_sglang_memory_accounting_stays_in_charge(sg, feather_on):
    """Feather orders and may STOP; what fits is SGLang's adder's call. 400 KV tokens: SGLang's
    fcfs fits two 144-token prompts in its pass. Under `grouped` (which never says STOP),
    A0's members wait a pass (they would compute its prefix again) while B0 takes the room
    left, then the members of both share the cached prefixes (16 tokens each), until
    SGLang's adder refuses."""
    from feather_sched.sglang.plugin import queue_for

    def engine(policy_env: str) -> Engine:
        feather_on.setenv("FEATHER_POLICY", policy_env)
        eng = Engine(sg, "fcfs", kv_tokens=400)
        eng.waiting_queue = interleaved(sg, 3)
        return eng

    off = rids(engine("off").step())
    assert off == rids(interleaved(sg, 3))[:2]  # the KV budget stops SGLang's fcfs
    eng = engine("grouped")
    steps = [rids(eng.step()) for _ in range(5)]
    assert steps == [["A0", "B0"], ["A1", "A2", "B1", "B2"], [], [], []]
    q = queue_for(eng.policy)
    assert q.stats.stops == 0 and q.stats.deferrals == 1  # A1; the adder stopped the rest
    assert len(eng.waiting_queue) == 6
    q.check(eng.waiting_queue, eng.running)


@pytest.mark.parametrize("policy", ["grouped", "fcfs"])
def test_no_request_dropped_or_duplicated(sg, feather_on, policy):
    """Waves of arrivals, finishes, a retraction, an abort and a chunked prefill; the CHT
    follows SGLang's lists after every pass and every request is admitted exactly once,
    whether the policy drives the passes (`grouped`) or leaves them to SGLang (`fcfs`)."""
    from feather_sched.sglang.plugin import queue_for

    feather_on.setenv("FEATHER_POLICY", policy)
    eng = Engine(
        sg, "fcfs", max_running_requests=6, chunked_prefill_size=64, max_prefill_tokens=400
    )
    q = queue_for(eng.policy)
    pending = [make_req(sg, f"{g}{i}", g, seed=1) for i in range(8) for g in "ABCD"]
    long_req = make_req(sg, "LONG", "C", tail=200)
    pending.insert(5, long_req)
    everyone = {r.rid for r in pending}
    admitted: Counter[str] = Counter()
    retracted = aborted = None
    steps = 0
    while pending or eng.waiting_queue or eng.running or eng.chunked_req:
        steps += 1
        assert steps < 200
        eng.waiting_queue += pending[:6]
        del pending[:6]
        if steps == 2:
            aborted = eng.waiting_queue.pop()
        passes = q.passes
        admitted.update(rids(r for r in eng.step() if r is not eng.chunked_req))
        if q.passes > passes:  # SGLang syncs the CHT when it forms a batch (or idles)
            q.check(eng.waiting_queue, eng.running)
        if steps == 3 and eng.running:  # decode ran out of KV: SGLang retracts one
            retracted = eng.running_batch.reqs.pop()
            eng.waiting_queue.append(retracted)
        else:  # the two oldest running requests finish
            del eng.running_batch.reqs[:2]
    eng.policy.calc_priority(eng.waiting_queue, eng.running_batch)  # last sync: all gone
    assert q.index.is_empty()
    assert aborted is not None and retracted is not None
    assert set(admitted) == everyone - {aborted.rid}
    assert admitted[retracted.rid] == 2
    assert all(n == 1 for rid, n in admitted.items() if rid != retracted.rid)
    # each prompt hashed once (the retracted one too); the aborted one was never seen
    assert q.stats.hashed == len(everyone) - 1
    assert "LONG" in admitted and q.chunked_rid is None
    assert q.stats.admitted == sum(admitted.values())  # each admission taken in once
    if policy == "fcfs":
        assert q.stats.policy_steps == 0 and q.stats.queue_order_steps > 0


def test_chunked_request_counts_as_running(sg, feather_on):
    from feather_sched.sglang.plugin import queue_for

    eng = Engine(sg, "fcfs", chunked_prefill_size=64)
    long_req = make_req(sg, "LONG", "A", tail=100)
    eng.waiting_queue = [long_req]
    eng.step()
    q = queue_for(eng.policy)
    assert eng.chunked_req is long_req and q.chunked_rid == "LONG"
    eng.waiting_queue += interleaved(sg, 2)
    eng.step()  # second chunk, plus others: LONG is running in the CHT though in no list
    assert q.index.state("LONG") is RequestState.RUNNING
    q.check(eng.waiting_queue, eng.running)


# ---------------------------------------------------------------------------- Feather off
def cached_radix_requests(sg):
    """Two prefixes cached, queue mixing cached, uncached-shared and unique prompts."""
    reqs = interleaved(sg, 3)
    reqs += [make_req(sg, f"U{i}", "D", tail=40, seed=i) for i in range(3)]
    return reqs


@pytest.mark.parametrize("policy", ["lpm", "fcfs", "dfs-weight"])
def test_plugin_off_leaves_sglang_orders_unchanged(sg, monkeypatch, policy):
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    def ordered(calc, feather: str) -> list[str]:
        monkeypatch.setenv("FEATHER_POLICY", feather)
        eng = Engine(sg, policy)
        for g in "AB":
            key = RadixKey(token_ids=array("q", PREFIXES[g]))
            eng.tree_cache.insert(InsertParams(key=key, value=torch.arange(PREFIX_LEN)))
        queue = cached_radix_requests(sg)
        calc(eng.policy, queue, eng.running_batch)
        return rids(queue), eng

    original, _ = ordered(sg.originals["calc_priority"], "off")
    patched_off, eng = ordered(sg.sp.SchedulePolicy.calc_priority, "off")
    assert patched_off == original
    assert sg.Scheduler.get_prefill_adder_class(eng) is sg.sp.PrefillAdder
    if policy == "lpm":  # lpm really reorders here (cached prefixes first)
        assert original[:2] == ["A0", "B0"] and original != rids(cached_radix_requests(sg))
    patched_on, eng = ordered(sg.sp.SchedulePolicy.calc_priority, "grouped")
    assert sorted(patched_on) == sorted(original)
    assert sg.Scheduler.get_prefill_adder_class(eng) is not sg.sp.PrefillAdder


def test_priority_scheduling_keeps_sglang(sg, feather_on):
    from feather_sched.sglang.plugin import queue_for

    tc = sg.RadixCache.create_simulated()
    policy = sg.sp.SchedulePolicy("fcfs", tc, False, True, False)
    assert queue_for(policy) is None


def test_policy_state_is_loaded_and_saved(sg, feather_on, tmp_path):
    """FEATHER_POLICY_STATE in SGLang as in vLLM: the learned state is saved while serving
    (from the step hook) and a new scheduler starts from it."""
    from types import SimpleNamespace

    from feather_sched.sglang.plugin import around_next_batch, queue_for

    path = tmp_path / "feather-state.json"
    feather_on.setenv("FEATHER_POLICY", "feather")
    feather_on.setenv("FEATHER_POLICY_STATE", str(path))
    feather_on.setenv("FEATHER_POLICY_STATE_EVERY_S", "1e-9")
    eng = Engine(sg, "fcfs", max_running_requests=6)
    q = queue_for(eng.policy)
    assert q is not None and q.state_saver is not None and q.state_saver.path == path
    for wave in range(6):
        eng.waiting_queue += [make_req(sg, f"{g}{i}-{wave}", g) for i in range(2) for g in "AB"]
        batch = eng.step()
        plan = SimpleNamespace(reqs=list(eng.running), forward_mode=None)
        around_next_batch(lambda scheduler, p=plan: p, eng)  # the step hook: feedback, save
        assert batch or eng.running
        del eng.running_batch.reqs[:3]  # some finish
    assert q.policy.decisions > 0, "the bandit was asked: there is state to keep"
    assert q.state_saver.saves > 0 and path.is_file()
    eng2 = Engine(sg, "fcfs")  # a restart: a new scheduler loads the file
    warm = queue_for(eng2.policy).policy
    assert warm.table.stats == q.policy.table.stats


def test_sglang_bench_runs(sg, tmp_path, monkeypatch):
    """`feather sglang-bench`, the SGLang counterpart of `feather bench --engine vllm`."""
    from feather_lab.harness.sglang_bench import main

    monkeypatch.setenv("FEATHER_POLICY", "grouped")
    out = tmp_path / "pass.json"
    args = ["--sizes", "16", "--repeats", "1", "--passes", "1", "--formations", "2"]
    assert main([*args, "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    row = record["results"][0]
    assert record["machine"] and record["formations"] == 2 and row["n_waiting"] == 16
    assert row["feather_admitted"] > 0 and row["lpm_admitted"] > 0
    # the added CPU is the median of the pairs' differences, not of the medians
    assert row["feather_added_ms_min"] <= row["feather_added_ms"]


def test_sglang_bench_beside_a_running_batch(sg, tmp_path, monkeypatch, capsys):
    """`--running R --policy feather`: both arms form their batch beside R running requests
    (Feather's CHT holds them as running), the record says so; a bad value exits 2 first."""
    from feather_lab.harness.sglang_bench import main

    monkeypatch.setenv("FEATHER_POLICY", "grouped")
    for bad, named in (
        (["--policy", "no-such-policy"], "no-such-policy"),
        (["--running", "8", "--max-running", "8"], "--running"),
        (["--running", "-1"], "--running"),
        (["--finished", "-1"], "--finished"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(["--sizes", "16", *bad])
        assert exit_.value.code == 2 and named in capsys.readouterr().err
    out = tmp_path / "pass.json"
    args = ["--sizes", "16", "--repeats", "1", "--passes", "1", "--formations", "2"]
    run = ["--running", "8", "--finished", "2", "--max-running", "32", "--policy", "feather"]
    assert main([*args, *run, "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert (record["running"], record["finished"], record["max_running"]) == (8, 2, 32)
    assert record["feather_policy"] == "feather"
    row = record["results"][0]
    assert row["lpm_admitted"] > 0 and row["feather_batch_formation_ms"] > 0
    # the running batch reaches Feather's CHT as running
    from feather_lab.harness import sglang_bench as H
    from feather_sched.sglang.plugin import queue_for

    s = H.Setup(0)
    s.max_running, s.feather_policy = 32, "feather"
    reqs, running = s.requests(16, "w"), s.requests(8, "r")
    tree, alloc = s.tree()
    policy, queue = H._formation_policy(s, "feather", tree, reqs, running=running)
    cht = queue_for(policy).book.cht
    assert (cht.num_running, cht.num_waiting) == (8, 16)
    assert s.batch_formation(policy, tree, alloc, queue, running) > 0
    # requests the CHT last saw running that finished by the formation leave it in its pass
    gone, (tree, alloc) = s.requests(2, "g"), s.tree()
    policy, queue = H._formation_policy(s, "feather", tree, reqs, running=running, gone=gone)
    cht = queue_for(policy).book.cht
    assert cht.num_running == 10
    admitted = s.batch_formation(policy, tree, alloc, queue, running)
    assert all(g.rid not in cht for g in gone) and cht.num_running == 8 + admitted
    # one Feather policy across formations, as a server keeps one; a fresh CHT each time
    again, _ = H._formation_policy(s, "feather", s.tree()[0], reqs, running=running)
    assert queue_for(again).policy is queue_for(policy).policy
    assert queue_for(again).book.cht is not cht
