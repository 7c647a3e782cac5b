"""The KV gate: its peak is a true upper bound, and under KV pressure feather stops thrashing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eager_kv_gate import EagerKvGate
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import SimulationError, simulate
from feather_lab.workloads.presets import build_workload
from feather_sched.cost.step_model import StepCostModel
from feather_sched.policies.kv_gate import CLIP_TOKENS, INIT_RATIO, MIN_RATIO, KvGate, _blocks
from feather_sched.policies.registry import make_policy
from feather_sched.request import Request

running_sets = st.lists(
    st.tuples(
        st.integers(0, 300),  # KV tokens held
        st.integers(0, 100),  # prompt tokens still to prefill
        st.integers(0, 200),  # output tokens still to generate
    ),
    max_size=12,
)


def true_peak(running: list[tuple[int, int, int]], bs: int) -> int:
    """Blocks the running set adds at its worst future step, stepped token by token: a
    request prefills at once, then grows one token a step until it finishes, when the blocks
    it added go back (its held ones are counted as staying: the gate assumes no more)."""
    horizon = max((r for _, _, r in running), default=0)
    peak = 0
    for t in range(horizon + 1):
        added = 0
        for held, prefill, left in running:
            if t < left or (t == left and left > 0):
                tokens = held + prefill + t
                added += -(-tokens // bs) - -(-held // bs)
        peak = max(peak, added)
    return peak


@settings(max_examples=200, deadline=None)
@given(running_sets, st.sampled_from([1, 16, 32]))
def test_peak_bounds_the_true_growth(running, bs) -> None:
    gate = KvGate()
    gate._free = 0
    gate._prefill = [-(-(h + p) // bs) - -(-h // bs) for h, p, _ in running]
    gate._remaining = [r for _, _, r in running]
    predicted = max(gate._peak_parts(0, bs))
    assert predicted >= true_peak(running, bs)
    held_to_end = sum(p + -(-r // bs) for p, r in zip(gate._prefill, gate._remaining))
    assert predicted <= held_to_end  # never worse than reserving everything to the end


class _View(SimpleNamespace):
    """A minimal host: free blocks, a running set, and candidates by id."""

    def running_kv(self):
        return iter(self.running)

    def request(self, rid):
        return self.requests[rid]

    def cached_blocks(self, rid):
        return 0


def _request(rid: str, prompt: int, output: int, firm: bool = True) -> Request:
    return Request(rid, [1] * prompt, output, meta={"firm_output": firm})


def test_gate_admits_what_fits_and_counts_refusals() -> None:
    reqs = {"a": _request("a", 64, 64), "b": _request("b", 64, 64)}
    view = _View(free_kv_blocks=13, num_preemptions=0, block_size=16, running=[], requests=reqs)
    gate = KvGate()
    gate.begin_step(view)
    assert gate.fits(view, "a")  # 4 prompt blocks + 4 to grow: 8 of 13
    assert not gate.fits(view, "b")  # another 8 does not fit beside it
    assert gate.refusals == 1


def test_bounded_outputs_use_the_ratio_and_a_preemption_resets_it() -> None:
    gate = KvGate()
    view = _View(free_kv_blocks=10, num_preemptions=0, block_size=16, running=[], requests={})
    gate.begin_step(view)
    assert MIN_RATIO < gate.ratio < INIT_RATIO
    assert gate._reserve(100, firm=True) == 100
    assert gate._reserve(100, firm=False) == int(100 * gate.ratio)
    assert gate._reserve(10 * CLIP_TOKENS, firm=True) == CLIP_TOKENS
    view.num_preemptions = 3
    gate.begin_step(view)
    assert gate.ratio == 1.0
    for _ in range(5000):
        gate.begin_step(view)
    assert gate.ratio == pytest.approx(MIN_RATIO)


def test_host_without_kv_state_gets_no_gate() -> None:
    view = SimpleNamespace(block_size=16)
    gate = KvGate()
    gate.begin_step(view)
    assert gate.fits(view, "anything") and gate.refusals == 0


def _kv_pressure(policy, blocks: int = 1024):
    requests = build_workload("paper-4g", "kv-bound").generate(0)
    cost = StepCostModel("cpu", "kv-bound")
    engine = EngineConfig(block_size=32, num_kv_blocks=blocks, max_num_batched_tokens=8192)
    return simulate(requests, policy, cost, engine)


def test_unbounded_gate_under_kv_pressure_does_not_preempt() -> None:
    """paper-4g at the real kv-bound engine's pressure: vLLM's order and the prefix order
    preempt about a hundred times; the gate holding until the KV fits (`max_hold_steps=None`)
    keeps everything it admits, and the run is no slower than without the gate."""
    fcfs = _kv_pressure(make_policy("fcfs"))
    ungated = _kv_pressure(make_policy("feather", kv_gate=False))
    gated = _kv_pressure(make_policy("feather", max_hold_steps=None))
    assert fcfs.preemptions > 50 and ungated.preemptions > 50
    assert gated.preemptions == 0
    assert gated.summary()["kv_refusals"] > 0 and gated.summary()["hold_releases"] == 0
    assert gated.output_tok_s >= ungated.output_tok_s
    assert len(gated.records) == len(fcfs.records)


def test_default_gate_keeps_the_tail_within_the_engines() -> None:
    """The default hold is bounded: Feather's TTFT p99 stays within 1.5x FCFS's (the
    unbounded gate's is several times it: it holds whole groups until earlier ones finish),
    and its throughput is at least FCFS's."""
    fcfs = _kv_pressure(make_policy("fcfs")).summary()
    bounded = _kv_pressure(make_policy("feather")).summary()
    unbounded = _kv_pressure(make_policy("feather", max_hold_steps=None)).summary()
    assert unbounded["ttft_p99_s"] > 3 * fcfs["ttft_p99_s"]
    assert bounded["ttft_p99_s"] <= 1.5 * fcfs["ttft_p99_s"]
    assert bounded["output_tok_s"] >= fcfs["output_tok_s"]
    assert bounded["hold_releases"] > 0


def test_inside_the_tail_bar_a_burst_that_outgrows_the_cache_preempts() -> None:
    """paper-4g at the real engine's pressure: its four groups' decodes need 1,536 blocks of
    1,024. Every hold bound that keeps TTFT p99 within 1.5x FCFS's starts everyone before
    anyone finishes, so the engine preempts; the rows that never preempt (the unbounded gate,
    the authors' two policies) all start their last group past that bar
    (benchmarks/paper-policies/README.md, "Why the default cannot have both on this row")."""
    bar = 1.5 * _kv_pressure(make_policy("fcfs")).summary()["ttft_p99_s"]
    for hold in (0, 2, 4):
        bounded = _kv_pressure(make_policy("feather", max_hold_steps=hold)).summary()
        assert bounded["ttft_p99_s"] <= bar and bounded["preemptions"] > 50
    for name in ("feather-hold", "feather-paper", "feather-upstream"):
        late = _kv_pressure(make_policy(name)).summary()
        assert late["preemptions"] == 0 and late["ttft_p99_s"] > 3 * bar


def test_gate_leaves_an_unpressured_run_alone() -> None:
    ungated = _kv_pressure(make_policy("feather", kv_gate=False), blocks=8192)
    gated = _kv_pressure(make_policy("feather"), blocks=8192)
    assert gated.summary()["kv_refusals"] == 0
    assert gated.output_tok_s == ungated.output_tok_s


BLOCK = 16


@settings(max_examples=100, deadline=None)
@given(
    pool=st.integers(6, 40),  # KV blocks of 16 tokens
    big=st.tuples(st.integers(1, 900), st.integers(1, 400)),  # prompt, output tokens
    others=st.lists(
        st.tuples(st.integers(1, 60), st.integers(1, 30), st.floats(0, 0.5)), max_size=6
    ),
    big_at=st.floats(0, 0.5),
    shared=st.integers(0, 2),  # blocks of prefix the big request shares with the others
)
def test_a_request_larger_than_the_kv_pool_is_an_error_or_served(
    pool: int, big: tuple[int, int], others: list, big_at: float, shared: int
) -> None:
    """Under feather's KV gate a request whose prompt + output cannot fit the whole pool
    (the gate refuses it for ever, so only the host's never-stall rule admits it) gets a
    clear error naming it; one that fits is served. Never a hang (max_steps would say so),
    never a request dropped or served twice. The others each fit the pool alone."""
    prefix = list(range(1, 1 + shared * BLOCK))
    reqs = [
        Request(f"o{i}", prefix + [1000 + 100 * i + k for k in range(n)], out, at)
        for i, (n, out, at) in enumerate(others)
        if len(prefix) + n + out <= pool * BLOCK
    ]
    prompt = (prefix + [50_000 + k for k in range(big[0])])[: max(big[0], 1)]
    reqs.append(Request("big", prompt, big[1], big_at))
    engine = EngineConfig(block_size=BLOCK, num_kv_blocks=pool, max_num_seqs=4, max_steps=20_000)
    policy = make_policy("feather", max_wait_s=0.05)
    too_big = len(prompt) + big[1] - 1 > pool * BLOCK  # the last token's KV is never stored
    try:
        result = simulate(reqs, policy, StepCostModel("h100-free-l2", "llama-3-8b"), engine)
    except SimulationError as err:
        assert too_big, err  # only the request that cannot fit may stop the run
        assert "request 'big'" in str(err) and "does not fit in an empty KV cache" in str(err)
        return
    assert not too_big, "a request larger than the pool was served"
    finished = sorted((r.request_id, r.output_len) for r in result.records)
    assert finished == sorted((r.request_id, r.output_len) for r in reqs)


class _CachingView(_View):
    """A host whose prefix cache moves as it admits, as vLLM's does: an admitted request's
    own blocks are cached at once (a later probe of it would read its whole prompt), and
    other candidates may gain hits. `cached_blocks` of a request admitted this step answers
    what it found then (the contract the put-off probe relies on). `probes` and `walked`
    count the walks over the cache (a recorded answer is no walk) and the blocks they read."""

    def cached_blocks(self, rid):
        if rid in self.found:
            return self.found[rid]
        return self._walk(rid, None)

    def _walk(self, rid: str, need: int | None) -> int:
        hit = self.cached_now[rid]
        self.probes += 1
        self.walked += hit + 1 if need is None else min(hit + 1, need)
        return hit

    def admit(self, rid: str) -> None:
        self.found[rid] = self.cached_now[rid]
        self.cached_now[rid] = -(-self.requests[rid].prompt_len // self.block_size)


class _StoppingView(_CachingView):
    """The same host, its walk stopped once the gate's answer is known (as vLLM's lookup
    over full-attention blocks can be)."""

    def cached_blocks_upto(self, rid, need):
        if rid in self.found:
            return min(self.found[rid], need)
        return min(self._walk(rid, need), need)


candidates = st.lists(
    st.tuples(
        st.integers(1, 600),  # prompt tokens
        st.integers(1, 300),  # output tokens
        st.booleans(),  # firm output
        st.integers(0, 40),  # blocks cached when first seen
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    free=st.integers(0, 120),
    running=st.lists(
        st.tuples(*[st.integers(0, 200)] * 3, st.booleans(), st.integers(0, 200)), max_size=6
    ),
    cands=candidates,
    gains=st.lists(st.integers(0, 3), min_size=12, max_size=12),
    stops=st.booleans(),
)
def test_putting_the_probe_off_changes_no_decision(free, running, cands, gains, stops) -> None:
    """Candidate by candidate, the gate that probes only when the cheap bound with nothing
    cached does not fit, and then walks the cache only as far as its answer needs (on a host
    that can stop its walk), ADDs and STOPs exactly as the one probing every candidate whole
    at once, ends the step in the same state once its put-off probes are made, and walks
    no more often and no further."""
    bs = 16
    reqs = {
        f"r{i}": _request(f"r{i}", prompt, out, firm)
        for i, (prompt, out, firm, _) in enumerate(cands)
    }

    def view(kind: type[_CachingView]) -> _CachingView:
        cached = {f"r{i}": min(c, prompt // bs) for i, (prompt, _, _, c) in enumerate(cands)}
        return kind(
            free_kv_blocks=free,
            num_preemptions=0,
            block_size=bs,
            running=running,
            requests=reqs,
            cached_now=cached,
            found={},
            probes=0,
            walked=0,
        )

    eager_view, lazy_view = view(_CachingView), view(_StoppingView if stops else _CachingView)
    eager, lazy = EagerKvGate(), KvGate()
    eager.begin_step(eager_view)
    lazy.begin_step(lazy_view)
    for i, rid in enumerate(reqs):
        decision = eager.fits(eager_view, rid)
        assert lazy.fits(lazy_view, rid) == decision, rid
        if decision:
            for v in (eager_view, lazy_view):
                v.admit(rid)
                for later in list(reqs)[i + 1 :]:  # its blocks may be others' prefix
                    v.cached_now[later] += gains[i]
    assert lazy.refusals == eager.refusals
    assert lazy_view.probes <= eager_view.probes
    assert lazy_view.walked <= eager_view.walked
    lazy._probe_deferred(lazy_view)
    assert (lazy._bound, lazy._prefill, lazy._remaining) == (
        eager._bound,
        eager._prefill,
        eager._remaining,
    )


_LEFT = st.integers(0, 600) | st.sampled_from([0, 31, 32, 33, 64])
"""Tokens left: ties with the candidate's (its place is after every request with as many)."""


@settings(max_examples=300, deadline=None)
@given(
    running=st.lists(st.tuples(st.integers(0, 40), _LEFT), max_size=12),
    candidate=st.tuples(st.integers(0, 40), _LEFT),
    bs=st.sampled_from([1, 16, 32]),
)
def test_peak_splits_at_the_candidate(running, candidate, bs) -> None:
    """The gate's peak, split at the candidate's place (`_peak_parts`: the steps before it,
    and those from it on, which hold its whole prefill), equals the reference's one sorted
    cumulative sum with the prefill in it, whatever the prefill."""
    gate, eager = KvGate(), EagerKvGate()
    for g in (gate, eager):
        g._prefill, g._remaining = [p for p, _ in running], [r for _, r in running]
    prefill, remaining = candidate
    low, high = gate._peak_parts(remaining, bs)
    assert max(low, high + prefill) == eager._peak(prefill, remaining, bs)


@settings(max_examples=200, deadline=None)
@given(
    running=st.lists(
        st.tuples(*[st.integers(0, 3 * CLIP_TOKENS)] * 3, st.booleans(), st.integers(0, 99)),
        max_size=12,
    ),
    bs=st.sampled_from([1, 16, 32]),
    steps=st.integers(0, 700),
)
def test_snapshot_sums_each_running_requests_blocks(running, bs, steps) -> None:
    """The snapshot's inline arithmetic is the helpers': per running request, the blocks its
    unfinished prefill adds (`_blocks`) and its output reserve (`_reserve`, at the ratio the
    decay has reached), and their sum in blocks."""
    view = _View(free_kv_blocks=7, num_preemptions=0, block_size=bs, running=running)
    gate = KvGate()
    for _ in range(steps):
        gate.begin_step(view)
    assert gate._snapshot(view)
    prefills = [_blocks(h + p, bs) - _blocks(h, bs) for h, p, _, _, _ in running]
    reserves = [gate._reserve(left, firm, done) for _, _, left, firm, done in running]
    assert gate._free == 7 and (gate._prefill, gate._remaining) == (prefills, reserves)
    assert gate._bound == sum(p + _blocks(r, bs) for p, r in zip(prefills, reserves))
