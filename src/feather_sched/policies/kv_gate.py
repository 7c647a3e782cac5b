"""KV gate: do not admit a request whose KV the engine cannot keep.

vLLM admits a request when its prompt's blocks fit now and preempts the most recently admitted
one when decodes later run out of blocks; under a prefix order the victim shares the batch's
prefix, so it is re-admitted first and preempted again. The gate admits a candidate only if its
uncached prompt and its growth fit beside what the running requests will still add at the worst
future step (SGLang's `PrefillAdder` rule, made less conservative: a request's growth is held
only until it finishes). An output known only by its cap is priced from the run's finished
outputs (`output_estimate`); until enough have finished, at SGLang's `new_token_ratio` of the
cap (0.7, decaying over 600 steps to 0.14 of that, 1.0 after a preemption). Reserves are clipped
at 4,096 tokens. The prefix-cache probe is put off while the answer cannot change. A host
without `free_kv_blocks`/`running_kv` (SGLang, whose adder reserves this way) gets no gate.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from feather_sched.policies.base import SchedulerView
from feather_sched.policies.output_estimate import OutputEstimate

CLIP_TOKENS = 4096
INIT_RATIO = 0.7
MIN_RATIO = INIT_RATIO * 0.14
DECAY_STEPS = 600


class KvView(Protocol):
    """What a host adds to its `SchedulerView` for the gate (optional: the gate is off
    without it). A host may also offer `cached_blocks_upto(request_id, need)`:
    `min(cached_blocks(request_id), need)` from a walk over the prompt's blocks that stops
    after `need` (the gate only asks whether that many are cached); without it the gate
    reads `cached_blocks`."""

    @property
    def free_kv_blocks(self) -> int:
        """Blocks allocatable now, cached-but-unreferenced ones included (they are evicted on
        demand)."""
        ...

    @property
    def num_preemptions(self) -> int:
        """Preemptions so far (a running count; the gate reads its increase)."""
        ...

    def running_kv(self) -> Iterator[tuple[int, int, int, bool, int]]:
        """Per running request: KV tokens held, prompt tokens still to prefill, output tokens
        still to generate, whether that output length is firm (else up to its cap), and
        output tokens generated so far."""
        ...


def _blocks(tokens: float, block_size: int) -> int:
    return -(-int(tokens) // block_size)


class KvGate:
    """Per-step KV headroom check (see the module doc)."""

    def __init__(self, outputs: OutputEstimate | None = None) -> None:
        self.outputs = outputs
        """The run's finished outputs (kept by the caller), pricing outputs known by a cap."""
        self.reset()

    def reset(self) -> None:
        self.ratio = INIT_RATIO
        self.refusals = 0
        """Candidates refused this run."""
        self._preemptions: int | None = None
        self._free: int | None = None
        self._blind = False
        """The host offers no KV view this step (`_snapshot` found none): every candidate
        fits, without asking the view again (a missing attribute is an exception caught)."""
        self._prefill: list[int] = []
        self._remaining: list[int] = []
        self._bound = 0
        self._bs = 1
        """The host's block size, read with the snapshot."""
        self._deferred: list[tuple[int, str, int]] = []
        """(position in `_prefill`, request id, prompt blocks) of candidates admitted without
        an exact probe."""

    def begin_step(self, view: SchedulerView) -> None:
        """A new step: the running set moved on (read it again when first needed), and the
        estimate of bounded outputs ages or, after a preemption, goes back to 1."""
        self._free, self._blind = None, False
        seen = getattr(view, "num_preemptions", None)
        if seen is not None and self._preemptions is not None and seen > self._preemptions:
            self.ratio = 1.0
        else:
            self.ratio = max(MIN_RATIO, self.ratio - (INIT_RATIO - MIN_RATIO) / DECAY_STEPS)
        self._preemptions = seen

    @property
    def blind(self) -> bool:
        """This step's host offers no KV view (known once `fits` was first asked): every
        candidate fits, so a caller may stop asking until the next step."""
        return self._blind

    def fits(self, view: SchedulerView, request_id: str) -> bool:
        """Would the candidate fit beside the running requests' growth at its peak? If so it
        joins this step's running set (the host is about to admit it).

        The prefix-cache probe (`cached_blocks`, a walk over the prompt's block hashes) is
        put off while the cheap bound fits even with nothing cached: cached blocks only lower
        the need, so the answer is the same ADD. The candidate then counts its whole prompt
        until a later candidate needs the exact sum; only then are the put-off probes made
        (`_probe_deferred`; the host answers what each found cached when it was admitted),
        so every decision and every later state equal probing each candidate at once. When
        the probe is needed, it walks only as far as the answer needs (`_probe`)."""
        if self._free is None and (self._blind or not self._snapshot(view)):
            self._blind = True
            return True
        bs = self._bs
        req = view.request(request_id)
        whole = -(-req.prompt_len // bs)  # `_blocks` and `_reserve`, inline (per candidate)
        if req.meta.get("firm_output", True):
            remaining = min(req.output_len, CLIP_TOKENS)
        else:
            remaining = self._reserve(req.output_len, False, 0)
        grow = -(-remaining // bs)
        if self._bound + whole + grow <= self._free:
            self._deferred.append((len(self._prefill), request_id, whole))
            self._admit(whole, remaining, self._bound + whole + grow)
            return True
        self._probe_deferred(view)
        return self._probe(view, request_id, whole, remaining, grow)

    def _probe(
        self, view: SchedulerView, request_id: str, whole: int, remaining: int, grow: int
    ) -> bool:
        """`fits` once the cheap bound did not fit, the put-off probes made (the state
        exact). Both tests (the bound, then the peak) are monotone in the candidate's uncached
        blocks: each fits from some number of cached blocks on, so the probe walks only that
        far (`_cached`), and the peak is computed only when the bound does not fit. An ADDed
        candidate counts `whole - cached` and its exact count is read later with the put-off
        ones (the host answers what it found when admitted)."""
        room = self._free - self._bound - grow  # prefill blocks the bound leaves room for
        need = whole - room
        cached = self._cached(view, request_id, need) if 0 < need <= whole else 0
        if need > 0 and (need > whole or cached < need):  # the bound does not fit
            low, high = self._peak_parts(remaining, self._bs)
            room = self._free - high if low <= self._free else -1
            if room < 0:
                self.refusals += 1
                return False
            peak_need = whole - room
            if need > whole and peak_need > 0:  # not probed yet
                cached = self._cached(view, request_id, peak_need)
            if cached < peak_need:
                self.refusals += 1
                return False
        prefill = max(0, whole - cached)
        if prefill > 0:
            self._deferred.append((len(self._prefill), request_id, whole))
        self._admit(prefill, remaining, self._bound + prefill + grow)
        return True

    @staticmethod
    def _cached(view: SchedulerView, request_id: str, need: int) -> int:
        """The candidate's cached blocks, counted up to `need` (all the answer needs): a host
        with `cached_blocks_upto` stops its walk there."""
        upto = getattr(view, "cached_blocks_upto", None)
        return (
            upto(request_id, need)
            if upto is not None
            else min(view.cached_blocks(request_id), need)
        )

    def _admit(self, prefill: int, remaining: int, bound: int) -> None:
        self._prefill.append(prefill)
        self._remaining.append(remaining)
        self._bound = bound

    def _probe_deferred(self, view: SchedulerView) -> None:
        """Replace the counts of the candidates admitted unprobed (or probed only as far as
        their answer needed) this step by their uncached blocks (the exact state probing at
        once would have built)."""
        for at, request_id, whole in self._deferred:
            prefill = max(0, whole - view.cached_blocks(request_id))
            self._bound -= self._prefill[at] - prefill
            self._prefill[at] = prefill
        self._deferred.clear()

    def _reserve(self, remaining: int, firm: bool, generated: int = 0) -> int:
        """Output tokens to hold for a request with `remaining` to its cap (or its output, if
        firm) after `generated`: firm, all; else the run's estimate, or the ratio before it."""
        if firm:
            return min(remaining, CLIP_TOKENS)
        outputs = self.outputs
        if outputs is not None and outputs.ready:
            return min(outputs.remaining(generated, generated + remaining), CLIP_TOKENS)
        return int(min(remaining, CLIP_TOKENS) * self.ratio)

    def _snapshot(self, view: SchedulerView) -> bool:
        """Read the free blocks and the running requests' outstanding needs (once a step:
        O(running), so `_blocks` and `_reserve` are written out inline here: a few dozen
        requests run, and the calls were half the loop's time); False when the host offers
        neither."""
        free = getattr(view, "free_kv_blocks", None)
        if free is None:
            return False
        bs = view.block_size
        prefills: list[int] = []
        reserves: list[int] = []
        bound = 0
        reserve_of = self._reserve
        for held, prefill, remaining, firm, generated in view.running_kv():
            blocks = -(-(held + prefill) // bs) + (-held // bs)  # ceil(after) - ceil(held)
            if firm:
                reserve = remaining if remaining < CLIP_TOKENS else CLIP_TOKENS
            else:
                reserve = reserve_of(remaining, False, generated)
            prefills.append(blocks)
            reserves.append(reserve)
            bound += blocks - (-reserve // bs)
        self._free, self._prefill, self._remaining, self._bound = free, prefills, reserves, bound
        self._bs = bs
        self._deferred = []
        return True

    def _peak_parts(self, remaining: int, bs: int) -> tuple[int, int]:
        """Most blocks the running set, with a candidate that prefills `p` blocks, adds at
        any future step: `max(low, high + p)`. With requests sorted by tokens left, just
        before the k-th finishes the first k still run: they hold their prefills and have
        grown by at most ceil(left_k / block) blocks each. The candidate's place in that
        order does not depend on `p` (after every request with as many tokens left or more),
        so the steps before it (`low`) do not count it and every step from it on (`high`,
        here with no prefill) holds all of it. Only computed when the cheap bound
        (everything held to the end) does not fit. Plain Python: a few dozen running
        requests, where numpy's per-call cost was most of the time."""
        left, prefills = self._remaining, self._prefill
        held = k = 0
        low, high = -1, None
        for i in sorted(range(len(left)), key=left.__getitem__, reverse=True):
            tokens = left[i]
            if high is None and tokens < remaining:  # the candidate's place
                k += 1
                high = held + k * -(-remaining // bs)
            held += prefills[i]
            k += 1
            steps = held + k * -(-tokens // bs)
            if high is None:
                low = max(low, steps)
            else:
                high = max(high, steps)
        if high is None:  # it has the fewest tokens left: it runs last
            high = held + (k + 1) * -(-remaining // bs)
        return low, high
