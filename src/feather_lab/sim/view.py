"""The simulated engine's state as its policy sees it (`SchedulerView`, `kv_gate.KvView`).

The queues, the clock, the KV cache and the request tracker live here; the admission, step
and result code of `Simulator` work on them in place.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from feather_lab.sim.config import EngineConfig
from feather_lab.sim.kv_cache import PagedKVCache
from feather_lab.sim.sched_cpu import SchedCpuClock
from feather_lab.sim.state import RunState, SimSeq, request_fields
from feather_sched.cost.step_model import StepCostModel
from feather_sched.host.admission import Hosted, PolicyHost
from feather_sched.host.tracker import RequestTracker, chunk_blocks
from feather_sched.index.records import QueueSizes
from feather_sched.policies.base import Policy
from feather_sched.request import Request


class SimView(QueueSizes, Hosted):
    """The engine's queues, clock, KV cache and CHT tracker, read through the policy's view."""

    _run: RunState

    def __init__(self, policy: Policy, cost: StepCostModel, config: EngineConfig | None) -> None:
        self.host = PolicyHost(policy, engine="the simulator", strict=True)
        self.cost = cost
        self.config = c = config or EngineConfig()
        self.kv = PagedKVCache(
            c.kv_blocks(cost.hardware, cost.model), c.block_size, c.enable_prefix_caching
        )
        self.num_kv_blocks = self.kv.num_free_blocks
        # The CHT's chunk is a whole number of KV blocks, as in the vLLM adapter; the tracker
        # is the engines' own, strict here (every move is known exactly).
        blocks = chunk_blocks(c.index_chunk_size, c.block_size)
        fields = request_fields(c.enable_prefix_caching)
        self.tracker = RequestTracker(c.block_size, blocks, fields, strict=True)
        self.index = self.tracker.cht
        self._now = 0.0
        self._waiting: dict[str, SimSeq] = {}
        self._running: dict[str, SimSeq] = {}
        self._seqs: dict[str, SimSeq] = {}
        self._admission_hits: dict[str, int] = {}  # this step's admissions: hit tokens
        self._num_preemptions = 0
        self._finished_outputs: list[tuple[int, int]] = []
        self.block_size = c.block_size  # SchedulerView: the prefix cache's block, in tokens
        self.max_num_seqs = c.max_num_seqs
        # The step's token budget (`order.GroupingJudge` prices prefill in steps of it), and
        # whether the scheduler's CPU hides under the GPU step (`order.overlaps_cpu`).
        self.max_num_batched_tokens = c.max_num_batched_tokens
        self.overlaps_cpu = c.async_scheduling
        SchedCpuClock.for_run(c.scheduler_cpu, policy.name, c.async_scheduling)  # checked now

    @property
    def now(self) -> float:
        return self._now

    def waiting_ids(self) -> Iterator[str]:
        return iter(self._waiting)

    def request(self, request_id: str) -> Request:
        """The request as the scheduler sees it (`state.scheduler_request`)."""
        return self._seqs[request_id].seen

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

    # CacheAwareView (policies/vllm_cache_aware.py)
    @property
    def kv_usage(self) -> float:
        return 1.0 - self.kv.num_free_blocks / self.num_kv_blocks if self.num_kv_blocks else 0.0

    def is_plain_waiting(self, request_id: str) -> bool:
        """Never preempted: the simulator has no blocked statuses, and a preempted request
        restarts from nothing (vLLM's PREEMPTED status tells it apart)."""
        return self._seqs[request_id].preemptions == 0

    @property
    def free_kv_blocks(self) -> int:
        return self.kv.num_free_blocks

    @property
    def num_preemptions(self) -> int:
        return self._num_preemptions

    def running_kv(self) -> Iterator[tuple[int, int, int, bool, int]]:
        for s in self._running.values():
            prefill = s.prefill_target - s.num_computed if s.prefilling else 0
            seen, done = s.seen, s.generated
            yield s.num_computed, prefill, seen.output_len - done, seen is s.req, done

    @property
    def finished_outputs(self) -> Sequence[tuple[int, int]]:
        """(output tokens, cap) of each finished request whose output the scheduler knew only
        as a cap, in finishing order (`policies.output_estimate`)."""
        return self._finished_outputs
