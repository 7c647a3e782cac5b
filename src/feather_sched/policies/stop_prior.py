"""The step-cost model's prior on a Feather decision: what STOP gains over ADD.

Two plans for the running batch and the candidate's whole waiting group, each decoding the
candidate's output (its length where firm, else the run's mean under its cap): ADD decodes them
together; STOP lets the batch decode alone, then the group alone. A marginal comparison (the
batch with the group against without it) would miss that a STOP lets a mixed batch drain back to
homogeneous ones.
"""

from __future__ import annotations

from feather_sched.cost.step_model import BatchShape, StepCostModel
from feather_sched.policies.base import SchedulerView
from feather_sched.policies.features import DecisionState
from feather_sched.policies.output_estimate import OutputEstimate, expected_output

PRIOR_CACHE_SIZE = 4096
"""Plan sizes whose prior gain is kept (cleared when full: a cache, never a table)."""


def mix(a: BatchShape, b: BatchShape) -> BatchShape:
    """Two decode batches run as one (their prefixes distinct, each group adjacent)."""
    n = a.num_decode + b.num_decode
    logical = a.logical_kv_tokens + b.logical_kv_tokens
    span = (a.shared_span_tokens * a.num_decode + b.shared_span_tokens * b.num_decode) / n
    return BatchShape(
        num_decode=n,
        logical_kv_tokens=logical,
        unique_kv_tokens=a.unique_kv_tokens + b.unique_kv_tokens,
        shared_unique_kv_tokens=a.shared_unique_kv_tokens + b.shared_unique_kv_tokens,
        shared_logical_kv_tokens=a.shared_logical_kv_tokens + b.shared_logical_kv_tokens,
        shared_span_tokens=span,
    )


class StopPrior:
    """STOP's relative gain over ADD by the cost model, with standard error `error` (smaller
    than the model's step-time error, as both plans share its bias)."""

    def __init__(
        self, cost: StepCostModel, error: float, outputs: OutputEstimate | None = None
    ) -> None:
        self.cost = cost
        self.error = error
        self.outputs = outputs
        """The run's finished outputs: a candidate known by its cap decodes their mean."""
        self.cache: dict[tuple[int, ...], float] = {}

    def estimate(
        self, view: SchedulerView, state: DecisionState, request_id: str
    ) -> tuple[float, float]:
        """(gain, standard error) for the candidate: STOP's time saving relative to the
        slower plan (both also pay the group's prefill, counted in the denominator). The
        batch is `state.batch` requests in `num_running_roots` groups, taken to share a
        prefix as long as its oldest request's (`running_shared_chunks`)."""
        index = view.index
        req = view.request(request_id)
        prefix = state.depth * index.chunk_size
        suffix = max(0, req.prompt_len - prefix)
        running = index.running_shared_chunks() * index.chunk_size or prefix
        b, g = state.batch, max(1, min(state.batch, index.num_running_roots))
        n = max(1, min(state.group, view.max_num_seqs))  # once open, the group floods in
        steps = max(1, round(expected_output(req, self.outputs)))
        plans = (b, g, n, prefix, suffix, running, steps)
        gain = self.cache.get(plans)
        if gain is None:
            if len(self.cache) >= PRIOR_CACHE_SIZE:
                self.cache.clear()
            gain = self.cache[plans] = self.plan_gain(*plans)
        return gain, self.error

    def plan_gain(
        self, b: int, g: int, n: int, prefix: int, suffix: int, running: int, steps: int
    ) -> float:
        """The relative gain for one set of plan sizes (cached: under a backlog the same
        candidate is asked about step after step)."""
        sizes = [b // g + (i < b % g) for i in range(g)]
        t, decode = self.cost.step_time, BatchShape.shared_prefix_decode
        tokens = prefix + n * suffix
        prefill = t(
            BatchShape(
                num_prefill_tokens=tokens,
                prefill_attn_pairs=prefix * (prefix + 1) // 2 + n * suffix * (prefix + suffix),
                logical_kv_tokens=tokens,
                unique_kv_tokens=tokens,
                num_prefill_seqs=n,
            )
        )
        batch, group = decode(sizes, running, suffix), decode([n], prefix, suffix)
        stop = steps * (t(batch) + t(group))
        add = steps * t(mix(batch, group))
        return (add - stop) / (max(add, stop) + prefill)
