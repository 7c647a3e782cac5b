"""Iteration-level serving simulator: continuous batching over a paged, prefix-cached KV.

Each step: release arrivals, serve the running requests and admit waiting ones
(`sim.admission`, as vLLM V1's scheduler), turn the batch's shape into the step's duration
(`sim.step_timer`), advance the clock, emit tokens, and free finished requests' blocks.
The run's books are checked at the end (`sim.books`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from feather_lab.sim.admission import SimAdmission
from feather_lab.sim.books import SimBooks
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.errors import SimulationError
from feather_lab.sim.kv_cache import block_hashes
from feather_lab.sim.result import RequestRecord, SimResult
from feather_lab.sim.sched_cpu import SchedCpuClock
from feather_lab.sim.state import RunState, Scheduled, SimSeq, scheduler_request
from feather_lab.sim.step_timer import StepTimer
from feather_sched.cost.step_model import StepCostModel
from feather_sched.host.admission import HostStats
from feather_sched.policies.base import Policy
from feather_sched.request import Request

__all__ = ["SimulationError", "Simulator", "simulate"]

Progress = Callable[[int, int], None]
"""Called every 256 steps with (finished, total)."""


class Simulator(SimAdmission, SimBooks):
    """One simulated engine run: `Simulator(...).run(requests)` -> SimResult."""

    def __init__(
        self,
        policy: Policy,
        cost: StepCostModel,
        config: EngineConfig | None = None,
        progress: Progress | None = None,
    ) -> None:
        super().__init__(policy, cost, config)
        self._progress = progress
        self.timer = StepTimer(cost, self.kv, self.index, self.config.block_size)

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
        dt, prefill_tokens = self.timer.time_step(run, scheduled, self._now)
        self._now += dt
        self._emit(run, scheduled)
        self._feedback(run, dt, len(scheduled), prefill_tokens)
        return run.records[done_before:]

    def close(self) -> SimResult:
        """The run's result, its books checked."""
        return self._result(self._run)

    # ------------------------------------------------------------------ arrivals
    def _start(self, requests: Sequence[Request]) -> RunState:
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
        return RunState(pending=order, deps=deps, total=len(order), cpu=cpu)

    def _release(self, req: Request, at: float) -> None:
        """A request enters the waiting queue (and the CHT) at time `at`."""
        bs = self.config.block_size
        seen = scheduler_request(req, self.config.scheduler_sees_output)
        seq = SimSeq(req, block_hashes(req.prompt, bs), seen, released_at=at)
        seq.prefill_target = req.prompt_len
        self._seqs[req.request_id] = seq
        self._waiting[req.request_id] = seq
        self.tracker.waiting(seq, at)
        if self._run.cpu is not None:
            self._run.cpu.arrived(1)

    def _release_arrivals(self, run: RunState) -> None:
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

    def _idle_until_next_arrival(self, run: RunState) -> None:
        if run.cursor < len(run.pending):
            self._now = max(self._now, run.pending[run.cursor].arrival_time)
            return
        raise SimulationError(
            f"{run.total - run.finished} requests can never run (blocked on dependencies: "
            f"{sorted(run.blocked)[:5]})"
        )

    # ------------------------------------------------------------------ tokens
    def _emit(self, run: RunState, scheduled: Scheduled) -> None:
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

    def _finish(self, seq: SimSeq) -> None:
        rid = seq.req.request_id
        if seq.finished_at is not None:
            raise SimulationError(f"request {rid!r} finished twice")
        seq.finished_at = self._now
        if not seq.seen.meta.get("firm_output", True):
            self._finished_outputs.append((seq.generated, seq.seen.output_len))
        del self._running[rid]
        self.kv.free(rid)
        self.tracker.forget(rid)

    def _feedback(self, run: RunState, dt: float, batch: int, prefill_tokens: int) -> None:
        self.host.feedback(self, dt, batch, prefill_tokens)
        every = self.config.check_invariants_every
        if every and run.step % every == 0:
            self.kv.check_invariants()
        if self._progress is not None and run.step % 256 == 0:
            self._progress(run.finished, run.total)


def simulate(
    requests: Sequence[Request],
    policy: Policy,
    cost: StepCostModel,
    config: EngineConfig | None = None,
    progress: Progress | None = None,
) -> SimResult:
    """Run one simulation (a fresh engine) and return its result."""
    return Simulator(policy, cost, config, progress).run(requests)
