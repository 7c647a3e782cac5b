"""Which requests run in a step: the running ones first, then the policy's admissions.

As vLLM V1's scheduler: running requests are served in admission order (a decode token
each, or the next prefill chunk), and when KV blocks run out the most recently admitted one
is preempted by recompute; then, if nothing was preempted, the policy proposes waiting
requests and the engine admits them until the token budget, `max_num_seqs` or the KV
allocator stops it, or the policy says STOP.
"""

from __future__ import annotations

import time

from feather_lab.sim.errors import SimulationError
from feather_lab.sim.state import RunState, Scheduled, SimSeq
from feather_lab.sim.view import SimView
from feather_sched.host.admission import AdmissionPass


class SimAdmission(SimView):
    """The engine's scheduling pass: serve the running, preempt, admit the waiting."""

    def _serve_running(self) -> tuple[Scheduled, int, bool]:
        """Running requests first, in admission order, growing their KV; when blocks run
        out the most recently admitted request is preempted. Returns (scheduled, token
        budget left, whether anything was preempted)."""
        budget = self.config.max_num_batched_tokens
        scheduled: Scheduled = []
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
        self, run: RunState, scheduled: Scheduled, budget: int, preempted: bool
    ) -> None:
        """The policy's admissions; never a stall. vLLM admits nothing in a step that
        preempted, unless nothing is left running."""
        cfg = self.config
        running = self._running
        can_admit = not preempted or not running
        if not (can_admit and self._waiting):
            return
        if budget <= 0 or len(running) >= cfg.max_num_seqs:
            self.host.idle(self)
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

    def _admit(self, budget: int, scheduled: Scheduled) -> tuple[float, AdmissionPass]:
        """Ask the policy for candidates; admit until the policy or the budgets stop it.

        Returns the CPU seconds spent inside the policy (begin_step, producing candidates,
        ADD/STOP), what `sched_us_per_step` reports, and the step's pass (for the
        never-stall rule). The engine's own bookkeeping is timed separately.
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

    def _try_admit(self, rid: str, budget: int, scheduled: Scheduled) -> bool:
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

    def _commit(self, seq: SimSeq, scheduled_tokens: int) -> None:
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
