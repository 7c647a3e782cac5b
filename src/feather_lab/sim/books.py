"""A run's result: each finished request's record, and the end-of-run check of the books.

The engine fails loudly: every request finishes exactly once with exactly its output
length, block refcounts stay consistent, and nothing is left queued, cached or indexed.
"""

from __future__ import annotations

import time

from feather_lab.sim.errors import SimulationError
from feather_lab.sim.result import RequestRecord, SimResult
from feather_lab.sim.state import RunState, SimSeq
from feather_lab.sim.view import SimView
from feather_sched.policies.base import policy_counters


class SimBooks(SimView):
    """Records finished requests and closes a run into its checked `SimResult`."""

    def _record(self, seq: SimSeq) -> RequestRecord:
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

    def _result(self, run: RunState) -> SimResult:
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
