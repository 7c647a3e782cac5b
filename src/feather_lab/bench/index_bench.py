"""`feather index-bench`: CPU cost of prefix detection, CHT vs token radix tree.

Both indexes answer the same scheduling question on the same queue: "which waiting requests
should the next prefill batch admit, best shared prefix first?".
- Radix (SGLang's LPM pass): the tree holds the cached prefixes (every shared prefix plus the
  running batch's prompts); match every waiting request against it, sort by matched length,
  admit the top `batch`. Cost grows with queue length x prompt length.
- CHT: repeatedly take the waiting request sharing the most chunks with the running batch and
  admit it (index updated as it goes). Cost depends on the batch and the prompt's chunk count,
  not on how many requests wait.
Insert cost: CHT = one hashing pass + registering the chunk keys; radix = inserting the prompt
into the tree (what SGLang does when it caches a request).
Memory: `bytes_per_request` = what the CHT allocates (tracemalloc) for the whole queue, per
waiting request, beside `digest_bytes_per_request` = 8 bytes x its chunks (the raw digests).
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from feather_sched.index.cht import ChunkedHashTree
from feather_sched.index.radix import RadixTree


@dataclass(frozen=True)
class IndexBenchCase:
    """One queue to measure: `queue` prompts of `prompt_tokens`, each one of `num_prefixes`
    shared prefixes of `prefix_tokens` followed by a private random suffix."""

    queue: int
    prompt_tokens: int
    prefix_tokens: int
    num_prefixes: int = 100

    def __post_init__(self) -> None:
        if self.queue < 1 or self.num_prefixes < 1:
            raise ValueError("queue and num_prefixes must be >= 1")
        if not 0 <= self.prefix_tokens <= self.prompt_tokens:
            raise ValueError("need 0 <= prefix_tokens <= prompt_tokens")


@dataclass(frozen=True, kw_only=True)
class IndexBenchRow(IndexBenchCase):
    """One case's figures at one CHT chunk size (the radix tree's, which has no chunks, are
    the same on every row of a case)."""

    chunk_size: int
    decision_batch: int
    cht_us_per_decision: float
    radix_us_per_decision: float
    cht_us_per_insert: float
    radix_us_per_insert: float
    cht_us_per_finish: float = 0.0
    """One finish (running -> gone) of an admitted request, index bookkeeping only."""
    bytes_per_request: float = 0.0
    """CHT memory per waiting request (tracemalloc, whole queue in the index)."""
    digest_bytes_per_request: float = 0.0
    """Raw digests per request: 8 bytes x chunks."""

    @property
    def decision_speedup(self) -> float:
        return self.radix_us_per_decision / self.cht_us_per_decision

    def to_dict(self) -> dict:
        d = asdict(self)
        d["decision_speedup"] = round(self.decision_speedup, 1)
        return d


INDEX_COLUMNS = (
    "queue",
    "prompt tokens",
    "CHT us/decision",
    "radix us/decision",
    "speedup",
    "CHT us/insert",
    "radix us/insert",
    "CHT us/finish",
    "bytes/request",
    "raw digest bytes",
)
"""The columns of one row, as `feather index-bench` prints it and the CHT page renders it."""


def index_cells(r: Mapping[str, Any]) -> list[str]:
    """One row (`IndexBenchRow.to_dict()` or a record's row) under `INDEX_COLUMNS`."""
    return [
        f"{r['queue']:,}",
        f"{r['prompt_tokens']:,}",
        f"{r['cht_us_per_decision']:,.1f}",
        f"{r['radix_us_per_decision']:,.0f}",
        f"{r['decision_speedup']:,.0f}x",
        f"{r['cht_us_per_insert']:,.1f}",
        f"{r['radix_us_per_insert']:,.1f}",
        f"{r['cht_us_per_finish']:,.1f}",
        f"{r['bytes_per_request']:,.0f}",
        f"{r['digest_bytes_per_request']:,.0f}",
    ]


DEFAULT_CASES = (
    IndexBenchCase(1_000, 2_000, 1_500),
    IndexBenchCase(10_000, 2_000, 1_500),
    IndexBenchCase(100_000, 2_000, 1_500),
    IndexBenchCase(1_000, 20_000, 15_000),
    IndexBenchCase(10_000, 20_000, 15_000),
    IndexBenchCase(1_000, 128_000, 96_000),
)
DEFAULT_CHUNK_SIZES = (16, 64, 512)
"""16 = one vLLM GPU KV block (the adapter's chunk); the paper used chunks of 50 and 500."""


def make_queue(case: IndexBenchCase, seed: int = 0) -> list[np.ndarray]:
    """Prompts for one case, deterministic for a seed; prefix g serves requests i % num_prefixes."""
    rng = np.random.default_rng(seed)
    prefixes = rng.integers(0, 32_000, (case.num_prefixes, case.prefix_tokens), dtype=np.int32)
    suffix_len = case.prompt_tokens - case.prefix_tokens
    group = rng.integers(0, case.num_prefixes, case.queue)
    out = []
    for i in range(case.queue):
        suffix = rng.integers(0, 32_000, suffix_len, dtype=np.int32)
        out.append(np.concatenate([prefixes[group[i]], suffix]))
    return out


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""`wall`: elapsed time (the default). `cpu`: this process's CPU time, for a machine shared with
other work: a long radix pass is descheduled many times there and a short CHT decision
rarely, so wall clock would favour the CHT."""
_now = time.perf_counter


def _timed(fn: Callable[[], object]) -> float:
    start = _now()
    fn()
    return _now() - start


def _us_each(fn: Callable[[], object], count: int) -> float:
    """Microseconds per item of one timed pass over `count` items, with the garbage
    collector off: a collection landing in one index's pass and not the other's would be
    charged to that index."""
    gc.disable()
    try:
        t = _timed(fn)
    finally:
        gc.enable()
    return t / count * 1e6


def run_cases(
    case: IndexBenchCase,
    *,
    chunk_sizes: Sequence[int] = (64,),
    batch: int = 32,
    running: int = 32,
    repeats: int = 5,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    clock: str = "wall",
) -> list[IndexBenchRow]:
    """Measure one case, one row per CHT chunk size (the radix pass, which has no chunks, is
    measured once). `running` requests of one group form the running batch first. `clock`:
    see `CLOCKS`."""
    global _now
    _now = CLOCKS[clock]
    say = progress or (lambda _msg: None)
    say(f"queue {case.queue:,} x {case.prompt_tokens:,} tokens: generating")
    prompts = make_queue(case, seed)
    ids = [f"q{i}" for i in range(len(prompts))]

    cht_rows = []
    running_ids: list[str] = []
    for chunk_size in chunk_sizes:
        row, running_ids = _cht_case(case, prompts, ids, chunk_size, batch, running, repeats, say)
        cht_rows.append(row)

    say("radix insert")
    radix = RadixTree()
    radix_insert_us = _radix_insert_us(radix, case, prompts, ids, seed)
    for rid in running_ids:  # the same group heads at every chunk size
        if rid not in radix:
            radix.insert(rid, prompts[int(rid[1:])])
    say("radix LPM passes")
    radix_times = _radix_decision_times(radix, prompts, ids, running_ids, batch, repeats)
    radix_us = round(statistics.median(radix_times) * 1e6, 2)

    return [
        IndexBenchRow(
            **asdict(case),
            chunk_size=chunk_size,
            decision_batch=take,
            cht_us_per_decision=round(statistics.median(cht_times) * 1e6, 2),
            radix_us_per_decision=radix_us,
            cht_us_per_insert=round(cht_insert_us, 2),
            radix_us_per_insert=round(radix_insert_us, 2),
            cht_us_per_finish=round(finish_us, 2),
            bytes_per_request=round(mem, 1),
            digest_bytes_per_request=round(8 * chunks, 1),
        )
        for chunk_size, take, cht_times, cht_insert_us, finish_us, mem, chunks in cht_rows
    ]


def _cht_case(case, prompts, ids, chunk_size, batch, running, repeats, say):
    """One chunk size: insert, memory, the running batch, the timed decisions. Returns the
    row's raw figures and the running batch's ids."""
    say(f"CHT chunk {chunk_size}: insert")  # hash + add = the per-request insert cost
    cht = ChunkedHashTree(chunk_size)
    cht_insert_us = _us_each(
        lambda cht=cht: [cht.add(rid, p) for rid, p in zip(ids, prompts)], len(ids)
    )
    digests = {rid: _digests_of(cht, rid) for rid in ids}
    say(f"CHT chunk {chunk_size}: memory")
    mem = _bytes_per_request(chunk_size, ids, digests)
    running_ids = _admit_running_batch(cht, case, ids, chunk_size, running)
    say(f"CHT chunk {chunk_size}: decisions")
    take = min(batch, cht.num_waiting)
    cht_times, finish_us = _cht_decision_times(cht, ids, take, repeats, digests)
    chunks = statistics.mean(len(d) for d in digests.values())
    return (chunk_size, take, cht_times, cht_insert_us, finish_us, mem, chunks), running_ids


def _digests_of(cht: ChunkedHashTree, rid: str) -> np.ndarray:
    """A request's chain as a uint64 array (also from an index whose keys are plain tuples,
    so the bench can time another CHT with the same API)."""
    keys = cht.keys_of(rid)
    if hasattr(keys, "digests"):
        return keys.digests()
    return np.array([k[1] for k in keys], dtype=np.uint64)


def _bytes_per_request(chunk_size: int, ids: list[str], digests: dict[str, np.ndarray]) -> float:
    """Bytes the CHT allocates per waiting request with the whole queue in it (tracemalloc;
    the digests are handed over already computed, so hashing temporaries are not counted)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cht = ChunkedHashTree(chunk_size)
        for rid in ids:
            cht.add(rid, digests=digests[rid])
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del cht
    return used / len(ids)


def _admit_running_batch(
    cht: ChunkedHashTree, case: IndexBenchCase, ids: list[str], chunk_size: int, running: int
) -> list[str]:
    """Admit the running batch: the oldest `running` members of the first request's prefix
    group (a server mid-way through one group), leaving at least one request waiting."""
    prefix_chunks = max(1, case.prefix_tokens // chunk_size)
    first_keys = cht.keys_of(ids[0])
    group_key = first_keys[min(prefix_chunks, len(first_keys)) - 1]
    running_ids = cht.group_members(group_key)[: min(running, case.queue - 1)]
    for rid in running_ids:
        cht.admit(rid)
    return running_ids


def _cht_decision_times(
    cht: ChunkedHashTree,
    ids: list[str],
    take: int,
    repeats: int,
    digests: dict[str, np.ndarray],
) -> tuple[list[float], float]:
    """Seconds per CHT decision: admit the `take` best candidates one by one (FCFS when none
    shares a chunk with the running batch). Between timed decisions the admitted requests
    finish (timed apart: microseconds per finish) and equivalent ones arrive again (untimed),
    so every decision sees the same queue. 20 x `repeats` decisions (median): one takes
    ~0.1-0.5 ms, so a few more samples keep the median steady on a busy machine."""

    def decision() -> list[str]:
        chosen = []
        for _ in range(take):
            cand = cht.best_candidate()
            rid = cand.request_id if cand is not None else next(cht.waiting_ids())
            cht.admit(rid)
            chosen.append(rid)
        return chosen

    times, finishes = [], []
    for _ in range(max(repeats, 3) * 20):
        start = _now()
        chosen = decision()
        times.append(_now() - start)
        start = _now()
        for rid in chosen:
            cht.finish(rid)
        finishes.append((_now() - start) / max(1, len(chosen)))
        for rid in chosen:
            cht.add(rid, digests=digests[rid])
    return times, statistics.median(finishes) * 1e6


def _radix_insert_us(
    radix: RadixTree, case: IndexBenchCase, prompts: list[np.ndarray], ids: list[str], seed: int
) -> float:
    """Microseconds per radix insert of a whole prompt (what SGLang does when it caches a
    request), timed on up to 2,000 sampled prompts into a tree already holding every shared
    prefix; the sampled prompts are removed again afterwards."""
    rng = np.random.default_rng(seed + 1)
    prefixes = {p[: case.prefix_tokens].tobytes(): p[: case.prefix_tokens] for p in prompts}
    for j, prefix in enumerate(prefixes.values()):
        radix.insert(f"prefix{j}", prefix)
    sample = rng.choice(len(prompts), size=min(len(prompts), 2_000), replace=False)
    us = _us_each(lambda: [radix.insert(ids[i], prompts[i]) for i in sample], len(sample))
    for i in sample:
        radix.remove(ids[i])
    return us


def _radix_decision_times(
    radix: RadixTree,
    prompts: list[np.ndarray],
    ids: list[str],
    running_ids: list[str],
    batch: int,
    repeats: int,
) -> list[float]:
    """Seconds per radix decision (SGLang's LPM pass): match every waiting prompt against
    the tree, sort by matched length, take the top `batch`. The first pass is untimed: it
    may split edges, and later passes see the settled tree."""
    running_set = set(running_ids)
    waiting = [i for i, rid in enumerate(ids) if rid not in running_set]

    def decision() -> list[int]:
        matched = [(radix.match_prefix(prompts[i]), i) for i in waiting]
        matched.sort(key=lambda m: -m[0])
        return [i for _, i in matched[:batch]]

    decision()
    return [_timed(decision) for _ in range(max(1, repeats))]
