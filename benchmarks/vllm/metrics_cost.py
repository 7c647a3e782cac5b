"""CPU that Feather's `/metrics` series add to each vLLM `schedule()` step.

Per scheduled step the vLLM scheduler adds one histogram observation of the batch's prefix
groups (`MetricsPublisher.observe_groups(cht.num_running_roots)`) and one check whether the
snapshot is due (`MetricsPublisher.due`); about once a second it writes the snapshot
(`publish`). This times exactly those calls, on the real objects (a `ChunkedHashTree` with a
running batch, a `HostStats`, the snapshot file where the vLLM plugin puts it), as medians of
interleaved repeats, and states the amortised cost per step at a given step rate.
Usage: python benchmarks/vllm/metrics_cost.py [--repeats 7] [--steps-per-s 100] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from feather_lab.bench.record import write_record
from feather_sched.host.admission import HostStats
from feather_sched.host.metrics import PUBLISH_EVERY_S, MetricsPublisher, snapshot_root
from feather_sched.index.cht import ChunkedHashTree

CALLS = 200_000


def running_tree(batch: int = 64, groups: int = 8) -> ChunkedHashTree:
    cht = ChunkedHashTree(64)
    for i in range(batch):
        digests = np.array([1000 + i % groups, 5000 + i], dtype=np.uint64)
        cht.add(f"r{i}", digests=digests)
        cht.admit(f"r{i}")
    return cht


def per_step_ns(pub: MetricsPublisher, cht: ChunkedHashTree) -> float:
    """One step's additions: the observation and the due check (never due here)."""
    pub._last = time.monotonic() + 1e9  # the write is timed apart
    t0 = time.perf_counter()
    for _ in range(CALLS):
        pub.observe_groups(cht.num_running_roots)
        pub.due(idle=False)
    return (time.perf_counter() - t0) / CALLS * 1e9


def publish_us(pub: MetricsPublisher, stats: HostStats, n: int = 2000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        pub.publish(stats, 3)
    return (time.perf_counter() - t0) / n * 1e6


def parse_args(doc: str | None) -> argparse.Namespace:
    """The options both metrics-cost scripts take."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps-per-s", type=float, default=100.0)
    parser.add_argument("--json", default=None)
    return parser.parse_args()


def main() -> None:
    args = parse_args(__doc__)
    cht, stats = running_tree(), HostStats(decisions=1000, stops=100, policy_steps=500)
    step, write = [], []
    with tempfile.TemporaryDirectory(dir=snapshot_root()) as tmp:  # where the plugin puts it
        pub = MetricsPublisher(tmp, "feather")
        for _ in range(args.repeats):  # interleaved: the machine's load hits both alike
            step.append(per_step_ns(pub, cht))
            write.append(publish_us(pub, stats))
    report(step, write, args, "snapshot write", "python benchmarks/vllm/metrics_cost.py")


def report(
    step: list[float], write: list[float], args: argparse.Namespace, what: str, command: str
) -> None:
    """Print the medians, spreads and amortised cost; write the record with --json. `what`
    names the once-a-second write (its record field: `<what>_us`, spaces as underscores)."""
    step_ns, write_us = statistics.median(step), statistics.median(write)
    amortised = step_ns + write_us * 1e3 / max(1.0, args.steps_per_s * PUBLISH_EVERY_S)
    print(
        f"per step (observe + due): median {step_ns:.0f} ns (min {min(step):.0f}, "
        f"max {max(step):.0f}) over {args.repeats} repeats"
    )
    print(f"{what}: median {write_us:.1f} us (min {min(write):.1f}, max {max(write):.1f})")
    print(f"amortised at {args.steps_per_s:g} steps/s: {amortised:.0f} ns per step")
    if args.json:
        key = what.replace(" ", "_") + "_us"
        write_record(
            args.json,
            command=command,
            repeats=args.repeats,
            per_step_ns=step,
            **{key: write},
            per_step_ns_median=step_ns,
            **{f"{key}_median": write_us},
            steps_per_s=args.steps_per_s,
            amortised_ns_per_step=amortised,
        )


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
