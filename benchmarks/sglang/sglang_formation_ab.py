"""Feather's part of SGLang's batch formation, A/B arms in one process (the SGLang CPU bar).

`feather sglang-bench` compares Feather's formation with lpm's across processes and spreads
~+-0.1 ms run to run, too much to see a change of that size. This runs, in one process and
interleaved formation by formation (the order rotating), SGLang's own batch formation
(harness/sglang_bench.py: calc_priority, then the adder loop) in these arms:

- `lpm`: lpm as shipped (SGLang's fcfs above 128 waiting), the bar's reference, after the
  same untimed setup as Feather's arm (`_formation_policy`: a CHT filled from the queue);
- `lpm-unlevelled`: the same without that setup (the bench's lpm arm before it was levelled:
  the difference is what the setup's sweep of the CPU caches costs the formation after it);
- `lpm-grouped-list`: the same, on the queue sorted beforehand into grouped order (each prefix
  group's members together, groups by first arrival: the order Feather's `grouped` admits
  in), so SGLang admits what Feather would, with no Feather code running;
- `feather`: Feather's `grouped` through the plugin, as `feather sglang-bench` runs it;
- `feather-memmove`: the same with every candidate moved by pop-then-insert (only the moved
  entry's reference touched) instead of `list_snapshot.move`'s choice by distance (a slice
  assignment, a reference-count touch on every entry between, when the move is short).

Workload: `feather sglang-bench`'s (100 shared 1,500-token prefixes, 2,000-token prompts, 17
admitted). Process CPU a formation; each arm's figure is the median over rounds of (arm -
lpm) within the round.

Usage: python benchmarks/sglang/sglang_formation_ab.py [--sizes 1000,10000] [--rounds 100]
           [--arms lpm,lpm-unlevelled,...] [--refresh] [--json OUT]
(in an environment with the `sglang` extra).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable

from feather_lab.bench.record import write_record
from feather_lab.harness import sglang_bench as H

ARMS = ("lpm", "lpm-unlevelled", "lpm-grouped-list", "feather", "feather-memmove")


def memmove(entries: list, j: int, slot: int) -> None:
    """`feather-memmove`'s move: pop, then insert, at any distance."""
    entries.insert(slot, entries.pop(j))


def grouped_list(reqs: list) -> list:
    """`reqs` with each prefix group's members together, groups in order of first arrival
    (a group's key: its prompt's first 64 tokens, inside the 1,500-token shared prefix)."""
    first: dict[tuple, int] = {}
    for i, r in enumerate(reqs):
        first.setdefault(tuple(r.origin_input_ids[:64]), i)
    return sorted(reqs, key=lambda r: first[tuple(r.origin_input_ids[:64])])


def formation_ms(
    s: H.Setup, reqs: list, arm: str, refresh: bool = False
) -> tuple[float, int, float]:
    """Process CPU of one batch formation of `arm` on a fresh radix tree (`reqs` already in
    the arm's list order), how many it admitted, and the CPU of SGLang's LRU refresh of the
    first 128 waiting prefixes inside it (`_touch_waiting_prefixes`, one walk of the radix
    tree each: cheaper where those 128 share few prefixes, as a grouped list's do; unless
    `refresh`, only the method's checks before it returns, ~0.05 ms: the bench's formation is
    a pass without the refresh, `sglang_bench.common_pass`)."""
    from feather_sched.sglang import queue as sglang_queue
    from feather_sched.sglang import snapshot as list_snapshot

    tree, alloc = s.tree()
    name = "lpm" if arm.startswith("lpm") else "feather"
    if arm == "lpm-unlevelled":
        policy, queue = s.policy("lpm", tree), list(reqs)
        policy = policy if refresh else H.common_pass(policy)
    else:  # as `feather sglang-bench`
        policy, queue = H._formation_policy(s, name, tree, reqs, refresh)
    mover: Callable = memmove if arm == "feather-memmove" else list_snapshot.move
    sglang_queue.move = mover
    cls = s.sp.SchedulePolicy
    touch, touched = cls._touch_waiting_prefixes, [0.0]

    def timed_touch(*args, **kwargs):
        t = time.process_time()
        try:
            return touch(*args, **kwargs)
        finally:
            touched[0] += time.process_time() - t

    cls._touch_waiting_prefixes = timed_touch
    try:
        gc.collect()
        t0 = time.process_time()
        admitted = s.batch_formation(policy, tree, alloc, queue)
        return (time.process_time() - t0) * 1e3, admitted, touched[0] * 1e3
    finally:
        sglang_queue.move = list_snapshot.move
        cls._touch_waiting_prefixes = touch


def measure(
    s: H.Setup, n: int, rounds: int, arms: tuple[str, ...] = ARMS, refresh: bool = False
) -> dict:
    reqs = s.requests(n, f"n{n}-")
    lists = {arm: grouped_list(reqs) if arm == "lpm-grouped-list" else reqs for arm in arms}
    times: dict[str, list[float]] = {a: [] for a in arms}
    touches: dict[str, list[float]] = {a: [] for a in arms}
    admitted: dict[str, set[int]] = {a: set() for a in arms}
    for k in range(rounds):
        k %= len(arms)
        for arm in arms[k:] + arms[:k]:
            ms, took, touch = formation_ms(s, lists[arm], arm, refresh)
            times[arm].append(ms)
            touches[arm].append(touch)
            admitted[arm].add(took)
    row: dict = {"n_waiting": n, "rounds": rounds}
    for arm in arms:
        row[f"{arm}_formation_ms"] = round(statistics.median(times[arm]), 4)
        row[f"{arm}_touch_ms"] = round(statistics.median(touches[arm]), 4)
        row[f"{arm}_admitted"] = sorted(admitted[arm])
    for arm in arms[1:]:
        added = [a - b for a, b in zip(times[arm], times["lpm"], strict=True)]
        q = statistics.quantiles(added, n=4)
        row[f"{arm}_minus_lpm_ms"] = round(statistics.median(added), 4)
        row[f"{arm}_minus_lpm_q1_q3_ms"] = [round(q[0], 4), round(q[2], 4)]
        rest = [
            (a - ta) - (b - tb)
            for a, ta, b, tb in zip(times[arm], touches[arm], times["lpm"], touches["lpm"])
        ]
        row[f"{arm}_minus_lpm_without_touch_ms"] = round(statistics.median(rest), 4)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--arms", default=",".join(ARMS), help="lpm first: the reference")
    ap.add_argument(
        "--refresh",
        action="store_true",
        help="formations on SGLang's every-32nd pass, with its LRU refresh (before this "
        "option every formation was one)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    arms = tuple(args.arms.split(","))
    if args.rounds < 4 or min(sizes) <= 17:
        ap.error("--rounds must be >= 4 and every size > 17")
    if arms[0] != "lpm" or not set(arms) <= set(ARMS):
        ap.error(f"--arms must start with lpm and name only {', '.join(ARMS)}; got {args.arms}")
    s = H.Setup(0)
    os.environ["FEATHER_POLICY"] = "grouped"  # the plugin registers its hooks when on
    from sglang.srt.plugins import load_plugins

    load_plugins()
    rows = []
    for n in sizes:
        rows.append(measure(s, n, args.rounds, arms, args.refresh))
        print(rows[-1], flush=True)
    if args.json:
        write_record(
            args.json,
            benchmark=__doc__.splitlines()[0],
            command="python benchmarks/sglang/sglang_formation_ab.py " + " ".join(sys.argv[1:]),
            rows=rows,
        )
    return 0


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    sys.exit(main())
