"""Iteration-level serving simulator: continuous batching over a paged, prefix-cached KV.

Each step (as in vLLM V1's scheduler): running requests are served first in admission order
(a decode token each, or the next prefill chunk), growing their KV and preempting the most
recently admitted request by recompute when blocks run out; then, if nothing was preempted,
the policy proposes waiting requests and the engine admits them until the token budget,
`max_num_seqs` or the KV allocator stops it, or the policy says STOP. The cost model turns the
batch's shape (tokens, KV read, sharing) into the step's duration; time advances; tokens are
emitted; finished requests free their blocks.

The engine checks its own books and fails loudly: every request finishes exactly once with
exactly its output length; block refcounts stay consistent; nothing leaks at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.kv_cache import PagedKVCache, block_hashes
from feather_lab.sim.result import RequestRecord, SimResult, StepLog
from feather_lab.sim.sched_cpu import SchedCpuClock
from feather_sched.cost.step_model import BatchShape, StepCostModel
from feather_sched.host.admission import AdmissionPass, Hosted, HostStats, PolicyHost
from feather_sched.host.tracker import RequestFields, RequestTracker, chunk_blocks
from feather_sched.policies.base import Policy, policy_counters
from feather_sched.request import Request


class SimulationError(RuntimeError):
    """The simulation cannot continue or broke an invariant (a bug, or an impossible input)."""


@dataclass(eq=False, slots=True)
class _Seq:
    req: Request
    hashes: list[int]
    released_at: float = 0.0
    num_computed: int = 0
    generated: int = 0
    prefill_target: int = 0
    prefilling: bool = True
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    computed_max: int = 0  # most KV tokens it ever held: prefill below it is recompute


def _fields(prefix_caching: bool) -> RequestFields:
    """How the tracker reads a simulated request (`_Seq`). As the vLLM adapter derives the
    CHT's chain: from the prefix cache's block hashes when it has them (prefix caching on),
    else from the tokens."""
    return RequestFields(
        request_id=lambda s: s.req.request_id,
        prompt=lambda s: s.req.prompt,
        max_tokens=lambda s: s.req.output_len,
        block_hashes=(lambda s: s.hashes) if prefix_caching else (lambda s: None),
        firm_output=lambda s: True,
        request=lambda s: s.req,
    )


@dataclass(eq=False, slots=True)
class _Run:
    """One run's progress and counters (the engine's queues live on the Simulator)."""

    pending: list[Request]  # every request, in arrival order; `cursor` marks the released
    deps: dict[str, str]  # request id -> the request it waits for (a conversation's turns)
    total: int
    cursor: int = 0
    blocked: dict[str, list[Request]] = field(default_factory=dict)  # parent -> children
    step: int = 0
    finished: int = 0
    records: list[RequestRecord] = field(default_factory=list)
    log: StepLog = field(default_factory=StepLog)
    policy_s: float = 0.0  # CPU time inside the policy
    engine_admit_s: float = 0.0  # CPU time of the engine's own admission bookkeeping
    recomputed: int = 0
    cpu: SchedCpuClock | None = None  # the scheduler's CPU on the clock (None: off)
    wall_start: float = field(default_factory=time.perf_counter)


class Simulator(Hosted):
    """One simulated engine run: `Simulator(...).run(requests)` -> SimResult."""

    def __init__(
        self,
        policy: Policy,
        cost: StepCostModel,
        config: EngineConfig | None = None,
        progress=None,
    ) -> None:
        self.host = PolicyHost(policy, engine="the simulator", strict=True)
        self.cost = cost
        self._order_sensitive = cost.order_sensitive
        self.config = config or EngineConfig()
        self._progress = progress
        c = self.config
        self.kv = PagedKVCache(
            c.kv_blocks(cost.hardware, cost.model), c.block_size, c.enable_prefix_caching
        )
        self.num_kv_blocks = self.kv.num_free_blocks
        # The CHT's chunk is a whole number of KV blocks, as in the vLLM adapter; the tracker
        # is the engines' own, strict here (every move is known exactly).
        blocks = chunk_blocks(c.index_chunk_size, c.block_size)
        fields = _fields(c.enable_prefix_caching)
        self.tracker = RequestTracker(c.block_size, blocks, fields, strict=True)
        self.index = self.tracker.cht
        self._now = 0.0
        self._waiting: dict[str, _Seq] = {}
        self._running: dict[str, _Seq] = {}
        self._seqs: dict[str, _Seq] = {}
        self._admission_hits: dict[str, int] = {}  # this step's admissions: hit tokens
        self._num_preemptions = 0
        self.block_size = c.block_size  # SchedulerView: the prefix cache's block, in tokens
        self.max_num_seqs = c.max_num_seqs
        SchedCpuClock.for_run(c.scheduler_cpu, policy.name, c.async_scheduling)  # checked now

    # ------------------------------------------------------------------ SchedulerView
    @property
    def now(self) -> float:
        return self._now

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def max_num_batched_tokens(self) -> int:
        """The step's token budget (`order.GroupingJudge` prices prefill in steps of it)."""
        return self.config.max_num_batched_tokens

    @property
    def overlaps_cpu(self) -> bool:
        """Whether the scheduler's CPU hides under the GPU step (`order.overlaps_cpu`)."""
        return self.config.async_scheduling

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def waiting_ids(self) -> Iterator[str]:
        return iter(self._waiting)

    def request(self, request_id: str) -> Request:
        return self._seqs[request_id].req

    def arrival_time(self, request_id: str) -> float:
        return self._seqs[request_id].released_at

    def block_hashes(self, request_id: str) -> Sequence[int]:
        return self._seqs[request_id].hashes

    def cached_blocks(self, request_id: str) -> int:
        """Blocks cached for the request now; for one admitted this step, what it found then
        (its own blocks are cached as it is admitted)."""
        hit = self._admission_hits.get(request_id)
        if hit is not None:
            return hit // self.config.block_size
        seq = self._seqs[request_id]
        if not self.config.enable_prefix_caching:
            return 0
        target = seq.req.prompt_len + seq.generated
        return self.kv.prefix_hit_tokens_lookup(seq.hashes, target) // self.config.block_size

    @property
    def free_kv_blocks(self) -> int:
        return self.kv.num_free_blocks

    @property
    def num_preemptions(self) -> int:
        return self._num_preemptions

    def running_kv(self) -> Iterator[tuple[int, int, int, bool]]:
        for s in self._running.values():
            prefill = s.prefill_target - s.num_computed if s.prefilling else 0
            yield s.num_computed, prefill, s.req.output_len - s.generated, True

    # ------------------------------------------------------------------ run
    def run(self, requests: Sequence[Request]) -> SimResult:
        """Serve `requests` to completion: `begin`, `step` until `done`, `close`."""
        self.begin(requests)
        while not self.done:
            self.step()
        return self.close()

    def begin(self, requests: Sequence[Request]) -> None:
        """Start a run of `requests` (more may join later: `sim.cluster` submits them)."""
        self._run = self._start(requests)

    @property
    def done(self) -> bool:
        """Every request of the run has finished."""
        return self._run.finished >= self._run.total

    def step(self) -> list[RequestRecord]:
        """One engine step, six phases: release arrivals, serve the running requests, admit
        waiting ones, cost the step, emit tokens, feed back. Returns the requests it
        finished (none when it only waited for the next arrival)."""
        run = self._run
        done_before = len(run.records)
        run.step += 1
        if run.step > self.config.max_steps:
            raise SimulationError(f"exceeded max_steps={self.config.max_steps}")
        self._release_arrivals(run)
        if not self._running and not self._waiting:
            self._idle_until_next_arrival(run)
            return []
        scheduled, budget, preempted = self._serve_running()
        self._admit_waiting(run, scheduled, budget, preempted)
        dt, prefill_tokens = self._cost_step(run, scheduled)
        self._emit(run, scheduled)
        self._feedback(run, dt, len(scheduled), prefill_tokens)
        return run.records[done_before:]

    def close(self) -> SimResult:
        """The run's result, its books checked."""
        return self._result(self._run)

    def _start(self, requests: Sequence[Request]) -> _Run:
        """Check the workload (unique ids, known dependencies) and set up the run."""
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            seen: set[str] = set()
            dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise ValueError(f"duplicate request id {dup!r} in the workload")
        order = sorted(requests, key=lambda r: r.arrival_time)
        deps = {r.request_id: r.meta["depends_on"] for r in order if r.meta.get("depends_on")}
        id_set = set(ids)
        for rid, dep in deps.items():
            if dep not in id_set:
                raise ValueError(f"request {rid!r} depends on unknown request {dep!r}")
        self.policy.reset()
        self.host.stats = HostStats()
        self._now = order[0].arrival_time if order else 0.0
        c = self.config
        cpu = SchedCpuClock.for_run(c.scheduler_cpu, self.policy.name, c.async_scheduling)
        return _Run(pending=order, deps=deps, total=len(order), cpu=cpu)

    def _release(self, req: Request, at: float) -> None:
        """A request enters the waiting queue (and the CHT) at time `at`."""
        bs = self.config.block_size
        seq = _Seq(req, block_hashes(req.prompt, bs), released_at=at)
        seq.prefill_target = req.prompt_len
        self._seqs[req.request_id] = seq
        self._waiting[req.request_id] = seq
        self.tracker.waiting(seq, at)
        if self._run.cpu is not None:
            self._run.cpu.arrived(1)

    def _release_arrivals(self, run: _Run) -> None:
        """Requests that have arrived by now; one whose parent is unfinished waits for it."""
        pending = run.pending
        while run.cursor < len(pending) and pending[run.cursor].arrival_time <= self._now:
            req = pending[run.cursor]
            run.cursor += 1
            dep = run.deps.get(req.request_id)
            dep_seq = self._seqs.get(dep) if dep is not None else None
            if dep is not None and (dep_seq is None or dep_seq.finished_at is None):
                run.blocked.setdefault(dep, []).append(req)  # released when `dep` finishes
            else:
                self._release(req, req.arrival_time)

    def _idle_until_next_arrival(self, run: _Run) -> None:
        if run.cursor < len(run.pending):
            self._now = max(self._now, run.pending[run.cursor].arrival_time)
            return
        raise SimulationError(
            f"{run.total - run.finished} requests can never run (blocked on dependencies: "
            f"{sorted(run.blocked)[:5]})"
        )

    def _serve_running(self) -> tuple[list[tuple[_Seq, int]], int, bool]:
        """Running requests first, in admission order: a decode token each or the next
        prefill chunk, growing their KV; when blocks run out the most recently admitted
        request is preempted (as vLLM V1 does). Returns (scheduled, token budget left,
        whether anything was preempted)."""
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[_Seq, int]] = []
        preempted = False
        running = self._running
        for rid in list(running):
            seq = running.get(rid)
            if seq is None:  # preempted earlier in this loop
                continue
            if budget <= 0:
                break
            need = min(seq.prefill_target - seq.num_computed, budget) if seq.prefilling else 1
            while not self.kv.grow(rid, seq.num_computed + need):
                victim_id = next(reversed(running))
                self._preempt(victim_id)
                preempted = True
                if victim_id == rid:
                    break
            if rid not in running:
                continue
            if seq.prefilling:
                self._commit(seq, seq.num_computed + need)
            scheduled.append((seq, need))
            budget -= need
        return scheduled, budget, preempted

    def _admit_waiting(
        self, run: _Run, scheduled: list[tuple[_Seq, int]], budget: int, preempted: bool
    ) -> None:
        """The policy's admissions; never a stall. vLLM admits nothing in a step that
        preempted, unless nothing is left running."""
        cfg = self.config
        running = self._running
        can_admit = not preempted or not running
        if not (can_admit and self._waiting and budget > 0 and len(running) < cfg.max_num_seqs):
            return
        waiting = len(self._waiting)
        t0 = time.perf_counter()
        policy_s, step = self._admit(budget, scheduled)
        run.policy_s += policy_s
        run.engine_admit_s += time.perf_counter() - t0 - policy_s
        head = step.force_head(len(running), lambda: next(iter(self._waiting), None))
        if head is not None and not self._try_admit(head, cfg.max_num_batched_tokens, scheduled):
            seq = self._waiting[head]
            raise SimulationError(
                f"request {head!r} ({seq.prefill_target} tokens) does not fit in an "
                f"empty KV cache of {self.kv.num_free_blocks} blocks x "
                f"{cfg.block_size} tokens"
            )
        if run.cpu is not None:
            run.cpu.passed(policy_s, waiting, waiting - len(self._waiting))

    def _cost_step(self, run: _Run, scheduled: list[tuple[_Seq, int]]) -> tuple[float, int]:
        """The batch's shape through the cost model; time advances. Returns (step seconds,
        prefill tokens)."""
        if not scheduled:
            raise SimulationError("no request could be scheduled in a step (engine stalled)")
        shape = self._shape(scheduled)
        cost = self.cost.breakdown(shape)
        dt = cost.total_s if run.cpu is None else run.cpu.step(cost.total_s)
        self._now += dt
        run.log.append(
            self._now,
            dt,
            len(scheduled),
            shape.num_decode,
            shape.num_prefill_tokens,
            self.index.num_running_roots,
            cost.kv_bytes_read,
        )
        return dt, shape.num_prefill_tokens

    def _shape(self, scheduled: list[tuple[_Seq, int]]) -> BatchShape:
        num_decode = prefill_tokens = prefill_pairs = logical = prefill_seqs = 0
        for seq, n in scheduled:
            if seq.prefilling:
                prefill_tokens += n
                prefill_seqs += 1
                prefill_pairs += n * seq.num_computed + n * (n + 1) // 2
                logical += seq.num_computed + n
            else:
                num_decode += 1
                logical += seq.num_computed + 1
        bs = self.config.block_size
        return BatchShape(
            num_decode=num_decode,
            num_prefill_tokens=prefill_tokens,
            prefill_attn_pairs=prefill_pairs,
            logical_kv_tokens=logical,
            unique_kv_tokens=min(logical, self.kv.num_used_blocks * bs),
            shared_unique_kv_tokens=self.kv.shared_blocks * bs,
            shared_logical_kv_tokens=self.kv.shared_refs * bs,
            num_prefill_seqs=prefill_seqs,
            shared_span_tokens=self._shared_span(scheduled) if self._order_sensitive else 0.0,
        )

    def _emit(self, run: _Run, scheduled: list[tuple[_Seq, int]]) -> None:
        """Computed tokens land; a finished prefill emits its first token, a decode its
        next; finished requests free their blocks and release the turns waiting on them."""
        for seq, n in scheduled:
            rid = seq.req.request_id
            if seq.prefilling and seq.num_computed < seq.computed_max:
                run.recomputed += min(seq.num_computed + n, seq.computed_max) - seq.num_computed
            seq.num_computed += n
            seq.computed_max = max(seq.computed_max, seq.num_computed)
            if seq.prefilling:
                if seq.num_computed < seq.prefill_target:
                    continue
                seq.prefilling = False
                if seq.first_token_at is None:
                    seq.first_token_at = self._now
            seq.generated += 1
            if seq.generated >= seq.req.output_len:
                self._finish(seq)
                run.finished += 1
                run.records.append(self._record(seq))
                for dep_req in run.blocked.pop(rid, ()):
                    self._release(dep_req, max(dep_req.arrival_time, self._now))

    def _feedback(self, run: _Run, dt: float, batch: int, prefill_tokens: int) -> None:
        self.host.feedback(self, dt, batch, prefill_tokens)
        every = self.config.check_invariants_every
        if every and run.step % every == 0:
            self.kv.check_invariants()
        if self._progress is not None and run.step % 256 == 0:
            self._progress(run.finished, run.total)

    def _result(self, run: _Run) -> SimResult:
        self._check_end(run.records, run.total)
        counters = policy_counters(self.policy)
        steps = max(1, run.step)
        return SimResult(
            policy=self.policy.name,
            records=run.records,
            steps=run.log.to_arrays(),
            sched_cpu_s=run.policy_s,
            wall_s=time.perf_counter() - run.wall_start,
            preemptions=sum(r.preemptions for r in run.records),
            forced_admissions=self.host.stats.forced + counters.get("starvation_admits", 0),
            prefix_hit_rate=self.kv.prefix_cache_hit_rate,
            num_kv_blocks=self.num_kv_blocks,
            extra={
                "engine_admit_us_per_step": run.engine_admit_s / steps * 1e6,
                "sched_us_per_decision": run.policy_s / max(1, self.host.stats.decisions) * 1e6,
                "decisions": self.host.stats.decisions,
                "recomputed_tokens": run.recomputed,
                **counters,
                **(run.cpu.summary() if run.cpu is not None else {}),
            },
        )

    # ------------------------------------------------------------------ internals
    def _shared_span(self, scheduled: list) -> float:
        """`BatchShape.shared_span_tokens`, in batch order: for each sequence whose first
        KV block another sequence also reads, the context tokens read since that block's
        previous reader (a sequence's shared blocks are its prefix, so its first block
        stands for them)."""
        kv = self.kv
        last: dict[int, int] = {}
        streamed = span = repeats = 0
        for seq, n in scheduled:
            blocks = kv.blocks_of(seq.req.request_id)
            if blocks and kv.refcount(blocks[0]) >= 2:
                first = blocks[0]
                if first in last:
                    span += streamed - last[first]
                    repeats += 1
                last[first] = streamed
            streamed += seq.num_computed + (n if seq.prefilling else 1)
        return span / repeats if repeats else 0.0

    def _admit(self, budget: int, scheduled: list[tuple[_Seq, int]]) -> tuple[float, AdmissionPass]:
        """Ask the policy for candidates; admit until the policy or the budgets stop it.

        Returns the CPU seconds spent inside the policy (begin_step, producing candidates,
        ADD/STOP) and the step's pass (for the never-stall rule). The CPU seconds are
        what `sched_us_per_step` reports; the engine's own bookkeeping
        (KV allocation, index updates) is timed separately.
        """
        cfg = self.config
        clock = time.perf_counter
        self._admission_hits.clear()
        t0 = clock()
        step = self.host.begin(self, self._waiting.__contains__, allow_queue_order=False)
        spent = clock() - t0
        try:
            while True:
                t0 = clock()
                rid = step.next_candidate()
                spent += clock() - t0
                if rid is None or len(self._running) >= cfg.max_num_seqs or budget <= 0:
                    break
                t0 = clock()
                add = step.accept(rid)
                spent += clock() - t0
                if not add:
                    break
                before = len(scheduled)
                if not self._try_admit(rid, budget, scheduled):
                    break
                budget -= scheduled[before][1]
        finally:
            step.close()
        return spent, step

    def _try_admit(self, rid: str, budget: int, scheduled: list[tuple[_Seq, int]]) -> bool:
        cfg = self.config
        seq = self._waiting[rid]
        target = seq.prefill_target
        hit = (
            self.kv.prefix_hit_tokens_lookup(seq.hashes, target) if cfg.enable_prefix_caching else 0
        )
        todo = target - hit
        if todo > budget and not cfg.enable_chunked_prefill:
            return False
        n = min(todo, budget)
        got = self.kv.allocate(rid, seq.hashes, hit + n, target)
        if got is None:
            return False
        if got != hit:
            raise SimulationError(f"prefix cache probe said {hit} hit tokens, allocate gave {got}")
        seq.num_computed = hit
        seq.prefilling = True
        self._admission_hits[rid] = hit
        self._commit(seq, hit + n)
        del self._waiting[rid]
        self._running[rid] = seq
        self.tracker.running(seq, self._now)
        scheduled.append((seq, n))
        return True

    def _commit(self, seq: _Seq, scheduled_tokens: int) -> None:
        """Register the prompt's full blocks scheduled so far in the prefix cache.

        As vLLM V1 does (`KVCacheManager.allocate_slots` caches up to num_computed +
        num_new_tokens at scheduling time): a request admitted later in the same step can
        already hit them, because every layer writes the batch's new KV before attending.
        """
        if self.config.enable_prefix_caching:
            self.kv.commit_full_blocks(
                seq.req.request_id, seq.hashes, min(scheduled_tokens, seq.req.prompt_len)
            )

    def _preempt(self, rid: str) -> None:
        """Recompute preemption: drop the KV, requeue at the front (as vLLM does)."""
        seq = self._running.pop(rid)
        self.kv.free(rid)
        self.tracker.waiting(seq, self._now)
        seq.num_computed = 0
        seq.prefilling = True
        seq.prefill_target = seq.req.prompt_len + seq.generated
        seq.preemptions += 1
        self._num_preemptions += 1
        self._waiting = {rid: seq, **self._waiting}

    def _finish(self, seq: _Seq) -> None:
        rid = seq.req.request_id
        if seq.finished_at is not None:
            raise SimulationError(f"request {rid!r} finished twice")
        seq.finished_at = self._now
        del self._running[rid]
        self.kv.free(rid)
        self.tracker.forget(rid)

    def _record(self, seq: _Seq) -> RequestRecord:
        assert seq.first_token_at is not None and seq.finished_at is not None
        return RequestRecord(
            request_id=seq.req.request_id,
            arrival=seq.released_at,
            first_token=seq.first_token_at,
            finish=seq.finished_at,
            prompt_len=seq.req.prompt_len,
            output_len=seq.generated,
            preemptions=seq.preemptions,
        )

    def _check_end(self, records: list[RequestRecord], total: int) -> None:
        ids = [r.request_id for r in records]
        if len(ids) != total or len(set(ids)) != total:
            raise SimulationError(f"{len(set(ids))} of {total} requests finished")
        for seq in self._seqs.values():
            if seq.generated != seq.req.output_len:
                raise SimulationError(
                    f"request {seq.req.request_id!r} generated {seq.generated} tokens, "
                    f"expected {seq.req.output_len}"
                )
        if self._running or self._waiting:
            raise SimulationError("requests left in the queues at the end")
        self.kv.check_invariants()
        self.kv.assert_empty()
        if not self.index.is_empty() or self.tracker.num_tracked:
            raise SimulationError("prefix index not empty at the end")


def simulate(
    requests: Sequence[Request],
    policy: Policy,
    cost: StepCostModel,
    config: EngineConfig | None = None,
    progress=None,
) -> SimResult:
    """Run one simulation (a fresh engine) and return its result."""
    return Simulator(policy, cost, config, progress).run(requests)
