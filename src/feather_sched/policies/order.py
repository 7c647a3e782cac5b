"""When prefix-grouped order can pay, and when to leave the engine's own order.

Grouped order (members of running groups first) beats the engine's order where it gets more
requests running: it fills free slots the engine's order would leave idle while prefilling
new prefixes (`idle_share`), it holds more requests in the same KV blocks where the engine
preempts, and decode reads fewer prefixes (`locality_gain`, which counts only where the host
forms batches while the GPU runs: in a synchronous loop, a batch grouped out of arrival order
costs the engine's per-request Python more than it saves). Where none holds, grouped order
only moves prefill into compute-bound steps, so Feather takes the engine's order; its ADD/STOP
decision still applies to a candidate opening a new prefix group.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import islice

from feather_sched.cost.step_model import BatchShape, StepCostModel
from feather_sched.policies.base import SchedulerView
from feather_sched.policies.features import shared_depth
from feather_sched.policies.output_estimate import OutputEstimate, expected_output

IDLE_SHARE = 0.01
"""Grouping can pay by filling the batch when the engine's order would leave at least this
share of the batch's slot-steps idle while it prefills the free slots' prompts (the slots
wait half the prefill on average; a request lives its output length in decode steps)."""
PREEMPT_MEMORY = 64
"""Steps after a preemption during which KV capacity counts as binding."""
LOCALITY_GAIN = 1.02
"""Grouping can pay through locality when the cost model prices a decode step of a full batch
in the engine's mix at least this much slower than the same batch grouped."""
CACHE_SIZE = 4096
"""Locality ratios kept per plan size (cleared when full: a cache, never a table)."""


class GroupingJudge:
    """Per-step verdict: can grouped order beat the engine's order here?"""

    def __init__(
        self, cost: StepCostModel | None = None, outputs: OutputEstimate | None = None
    ) -> None:
        self.cost = cost
        self.outputs = outputs
        """The run's finished outputs, pricing an output known only by its cap."""
        self._locality: dict[tuple[int, int, int, int], float] = {}
        self.reset()

    def reset(self) -> None:
        """A new run: no preemption seen."""
        self._steps = 0
        self._preemptions = 0
        self._last_preempt_step = -PREEMPT_MEMORY - 1

    def observe(self) -> None:
        """A step ran."""
        self._steps += 1

    def grouping_pays(self, view: SchedulerView) -> bool:
        """True where grouped order may beat the engine's order this step."""
        if self.cost is None or self.cost.order_sensitive:  # see `locality_gain`
            return True
        return (
            self._kv_binds(view)
            or (overlaps_cpu(view) and self.locality_gain(view) >= LOCALITY_GAIN)
            or self.idle_share_reaches(view, IDLE_SHARE)
        )

    def explores_stop(self, view: SchedulerView) -> bool:
        """Whether the bandit may spend its exploration budget on STOP this step. Not on a
        synchronous host (`overlaps_cpu` False) under a model that prices GPU steps (not
        `order_sensitive`): a STOP buys decode locality with more steps of smaller batches,
        and there every step also carries the host's own CPU, which the model's prior does
        not price. STOP is then taken only where the prior and the rewards say it wins with
        confidence. Without a model, or on a sequential kernel, exploring is how STOP's gain
        is found, and an overlapping host hides its CPU under the GPU's step."""
        if self.cost is None or self.cost.order_sensitive:
            return True
        return overlaps_cpu(view)

    def _kv_binds(self, view: SchedulerView) -> bool:
        seen = getattr(view, "num_preemptions", None)
        if seen is not None and seen > self._preemptions:
            self._preemptions = seen
            self._last_preempt_step = self._steps
        return self._steps - self._last_preempt_step <= PREEMPT_MEMORY

    def idle_share(self, view: SchedulerView) -> float:
        """Share of the batch's slot-steps the engine's order leaves idle while it prefills
        the shared prefixes of what fills the free slots, where grouped order would not
        (`_Wave`): `free` slots wait half of `prefill / budget` steps each,
        out of `max_num_seqs` slots living `output` decode steps. A host that does not say its
        token budget (`max_num_batched_tokens`) gets 1.0: grouped order."""
        wave = _Wave.ahead(view, self.outputs)
        return wave if isinstance(wave, float) else wave.share(wave.prefill())

    def idle_share_reaches(self, view: SchedulerView, threshold: float) -> bool:
        """`idle_share(view) >= threshold`, probing the host's prefix cache only while the
        answer is open. Each probe is a real cache match (SGLang's radix tree: a large share of
        the judge's time), and the share only falls as probes
        find prefixes cached: the wave's prefill with none cached bounds it from above, the
        prefill of the prefixes probed so far from below, and once either bound settles the
        verdict the rest are not probed."""
        wave = _Wave.ahead(view, self.outputs)
        if isinstance(wave, float):
            return wave >= threshold
        for low, high in wave.bounds():
            if wave.share(high) < threshold:
                return False
            if wave.share(low) >= threshold:
                return True
        return False  # unreachable: the last bounds are equal

    def locality_gain(self, view: SchedulerView) -> float:
        """Decode time per token of a full batch in the engine's mix over grouped order's, by
        the cost model. The mix: as many groups as the queue holds prefixes, up to the batch;
        grouped: the same batch over as few groups as the mean group size allows, or one
        group's batch at a time (a STOP lets groups run apart where one batch would hold them
        all), whichever decodes faster; prefix: the queue head's shared prefix (or the running
        batch's, if longer).

        Infinite without a model (nothing says grouping cannot pay: a policy without a prior
        keeps grouped order and learns locality from its rewards) and on a sequential kernel
        (`order_sensitive`: a CPU's attention reuses a prefix only while its readers sit
        adjacent, as grouped order leaves them and a shuffled queue does not)."""
        index = view.index
        roots = index.num_shared_roots
        if self.cost is None or self.cost.order_sensitive:
            return math.inf
        if roots == 0:
            return 1.0
        live = index.num_waiting + index.num_running
        batch = max(1, min(view.max_num_seqs, live))
        mixed, grouped = min(batch, roots), max(1, math.ceil(batch * roots / live))
        alone = min(batch, math.ceil(live / roots))  # one group's batch: its mean size
        head = next(view.waiting_ids(), None)
        depth = shared_depth(index, head) if head is not None else 0
        prefix = max(depth, index.running_shared_chunks()) * index.chunk_size
        key = (batch, mixed, grouped, alone, prefix)
        gain = self._locality.get(key)
        if gain is None:
            if len(self._locality) >= CACHE_SIZE:
                self._locality.clear()
            gain = self._locality[key] = _decode_ratio(
                self.cost, batch, mixed, grouped, alone, prefix
            )
        return gain


def overlaps_cpu(view: SchedulerView) -> bool:
    """Whether the host forms the next batch while the GPU runs this one (`overlaps_cpu` on
    the view: vLLM's async scheduling, SGLang's overlap loop); a host that does not say is
    taken to overlap, as both engines do by default on a GPU."""
    return getattr(view, "overlaps_cpu", None) is not False


def _decode_ratio(
    cost: StepCostModel, batch: int, mixed: int, grouped: int, alone: int, prefix: int
) -> float:
    """Decode time per token of `batch` sequences over `mixed` prefixes of `prefix` tokens,
    over the faster of the same batch over `grouped` prefixes and a batch of `alone`
    sequences of one prefix (the groups decoded apart, one after another)."""
    if prefix <= 0 or mixed <= 1:
        return 1.0

    def per_token(size: int, groups: int) -> float:
        sizes = [size // groups + (i < size % groups) for i in range(groups)]
        return cost.step_time(BatchShape.shared_prefix_decode(sizes, prefix)) / size

    fast = min(per_token(batch, grouped), per_token(alone, 1))
    return per_token(batch, mixed) / fast if fast > 0 else 1.0


class _Wave:
    """The first `free` waiting requests in queue order, which the engine's order admits
    next: how many (`taken`), their output tokens, and the shared prefixes among them that
    the host must compute and grouped order need not (`open`: one (request, depth, held)
    per distinct prefix that no running request holds, each computed once: an earlier one in
    the wave computes it for the rest). A request's own suffix, and a prefix it shares with
    no one, are computed in any order, so they are not counted; nor is a prefix the host
    still caches from finished requests (SGLang's radix tree, vLLM's prefix cache keep them
    after a burst's wave drains: its refill costs suffixes only), which only a probe of the
    host's cache (`cached_blocks`) tells.

    The open prefixes are found only when a verdict needs them (`bounds`): no open prefix
    is longer than its request's whole chain, so the wave's chains bound their prefill from
    above for the price of one lookup a request, where finding them walks each request's
    path in the CHT. Where outputs are long next to the prefill the free slots wait for (the
    usual decode-heavy batch), that bound already settles the verdict. A host may keep the
    wave's sums itself (`head_totals(n)`: requests, output tokens and chain levels of its
    first `n` waiting, or None where it cannot say; the SGLang adapter sums figures kept per
    request at C speed); else they are read request by request."""

    def __init__(
        self, view: SchedulerView, free: int, budget: int, outputs: OutputEstimate | None = None
    ) -> None:
        self.view, self.budget, self._free, self._outputs = view, budget, free, outputs
        self._rids: list[str] | None = None
        self._open: list[tuple[str, int, int]] | None = None
        head_totals = getattr(view, "head_totals", None)
        totals = head_totals(free) if head_totals is not None else None
        self.taken, self.output, levels = totals if totals is not None else self._totals()
        self.ceiling = levels * view.index.chunk_size
        """Prompt tokens in the wave's chains: at least the open prefixes' prefill."""

    @property
    def rids(self) -> list[str]:
        """The wave's request ids, in queue order (read once, when first needed)."""
        if self._rids is None:
            self._rids = list(islice(self.view.waiting_ids(), self._free))
        return self._rids

    def _totals(self) -> tuple[int, int, int]:
        """(requests, output tokens, chain levels) of the wave, read request by request (a
        host's `head_totals` gives them at once, where it keeps them)."""
        request, chunks = self.view.request, self.view.index.total_chunks
        output = levels = 0
        outputs = self._outputs
        for rid in self.rids:  # one loop: every call here runs once a request a pass
            output += expected_output(request(rid), outputs)
            levels += chunks(rid)
        return len(self.rids), output, levels

    @property
    def open(self) -> list[tuple[str, int, int]]:
        """(request, depth, held) per distinct open prefix, in queue order (walked once)."""
        found = self._open
        if found is None:
            found, seen, index = [], set(), self.view.index
            for rid in self.rids:
                depth, prefix, held = index.shared_prefix(rid)
                if depth > held and prefix not in seen:
                    seen.add(prefix)
                    found.append((rid, depth, held))
            self._open = found
        return found

    @classmethod
    def ahead(cls, view: SchedulerView, outputs: OutputEstimate | None = None) -> _Wave | float:
        """The wave, or the share itself where no wave is needed: 1.0 for a host that does
        not say its token budget, 0.0 with no free slot or nothing waiting."""
        budget = getattr(view, "max_num_batched_tokens", None)
        if budget is None:
            return 1.0
        free = view.max_num_seqs - view.num_running
        if free <= 0:
            return 0.0
        wave = cls(view, free, budget, outputs)
        return wave if wave.taken else 0.0

    def share(self, prefill: int) -> float:
        """The idle share if the engine's order computes `prefill` prompt tokens first."""
        view, taken = self.view, self.taken
        steps = prefill / max(1, self.budget - view.num_running)
        return taken * steps / 2 / (view.max_num_seqs * max(1.0, self.output / taken))

    def bounds(self) -> Iterator[tuple[int, int]]:
        """(low, high) bounds on the wave's prefill, each tighter than the one before: first
        the wave's chains (nothing walked), then every open prefix uncached (nothing
        probed), then one cache probe each, the last exact (low == high)."""
        yield 0, self.ceiling
        view, chunk = self.view, self.view.index.chunk_size
        high = sum(depth - held for _, depth, held in self.open) * chunk
        low = 0
        yield low, high
        for rid, depth, held in self.open:
            cached = view.cached_blocks(rid) * view.block_size // chunk
            uncached = max(0, depth - max(held, cached)) * chunk
            low += uncached
            high -= (depth - held) * chunk - uncached
            yield low, high

    def prefill(self) -> int:
        """The wave's prefill, every open prefix probed."""
        *_, (low, _) = self.bounds()
        return low
