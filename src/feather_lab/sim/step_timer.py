"""A step's duration: the batch's shape through the cost model, plus the scheduler's CPU."""

from __future__ import annotations

from feather_lab.sim.errors import SimulationError
from feather_lab.sim.kv_cache import PagedKVCache
from feather_lab.sim.state import RunState, Scheduled
from feather_sched.cost.step_model import BatchShape, StepCostModel
from feather_sched.index.cht import ChunkedHashTree


class StepTimer:
    """Prices one engine step from its batch and the KV cache's sharing, and logs it."""

    def __init__(
        self, cost: StepCostModel, kv: PagedKVCache, index: ChunkedHashTree, block_size: int
    ) -> None:
        self.cost = cost
        self.kv = kv
        self.index = index
        self.block_size = block_size
        self._order_sensitive = cost.order_sensitive

    def time_step(self, run: RunState, scheduled: Scheduled, now: float) -> tuple[float, int]:
        """The step that starts at `now`: its seconds and prefill tokens; logged at its end."""
        if not scheduled:
            raise SimulationError("no request could be scheduled in a step (engine stalled)")
        shape = self.shape(scheduled)
        cost = self.cost.breakdown(shape)
        dt = cost.total_s if run.cpu is None else run.cpu.step(cost.total_s)
        run.log.append(
            now + dt,
            dt,
            len(scheduled),
            shape.num_decode,
            shape.num_prefill_tokens,
            self.index.num_running_roots,
            cost.kv_bytes_read,
        )
        return dt, shape.num_prefill_tokens

    def shape(self, scheduled: Scheduled) -> BatchShape:
        """What the cost model reads of the batch: tokens, attention work and KV sharing."""
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
        bs = self.block_size
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

    def _shared_span(self, scheduled: Scheduled) -> float:
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
