"""CPU that Feather's `feather_*` series add to each SGLang event-loop iteration.

With SGLang's metrics on, the plugin's `around_next_batch` hook ends each iteration in
`_publish`: one `Histogram.observe` of the batch's prefix groups (prometheus_client in
multiprocess mode, as SGLang runs it: the value goes to a memory-mapped file) and one check
whether the counters are due; about once a second it adds the counters' deltas (`publish`).
This times exactly `_publish` on a real `SGLangQueue` and `PrometheusSeries`, in CPU time
(`time.process_time`), as medians of interleaved repeats, and states the amortised cost per
step at a given step rate (printed and recorded as benchmarks/vllm/metrics_cost.py does).
Needs prometheus_client (SGLang's dependency), not SGLang.
Usage: python benchmarks/sglang/metrics_cost.py [--repeats 7] [--steps-per-s 100] [--json FILE]
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from pathlib import Path

CALLS = 100_000


def per_step_ns(publish, queue) -> float:
    """One iteration with a batch: the observation and the due check (never due here)."""
    t0 = time.process_time()
    for _ in range(CALLS):
        publish(None, queue, True)
    return (time.process_time() - t0) / CALLS * 1e9


def publish_us(series, stats, n: int = 2000) -> float:
    """The counters' update, each call with every counter moved (the worst case)."""
    t0 = time.process_time()
    for _ in range(n):
        stats.decisions += 2
        stats.stops += 1
        stats.policy_steps += 1
        stats.admitted += 1
        series.publish(stats, stats.stops)
    return (time.process_time() - t0) / n * 1e6


def measure(repeats: int) -> tuple[list[float], list[float]]:
    from feather_sched.host.prometheus_series import PrometheusSeries
    from feather_sched.policies.registry import make_policy
    from feather_sched.sglang import plugin
    from feather_sched.sglang.queue import SGLangQueue

    queue = SGLangQueue(make_policy("grouped"))
    series = PrometheusSeries("grouped")
    plugin._SERIES[queue] = series
    step, write = [], []
    for _ in range(repeats):  # interleaved: the machine's load hits both alike
        series._last = time.monotonic() + 1e9  # the counters' update is timed apart
        step.append(per_step_ns(plugin._publish, queue))
        write.append(publish_us(series, queue.stats))
    return step, write


def main() -> None:
    vllm_script = Path(__file__).resolve().parents[1] / "vllm" / "metrics_cost.py"
    spec = importlib.util.spec_from_file_location("vllm_metrics_cost", vllm_script)
    shared = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shared)  # the same options, report and record as vLLM's
    args = shared.parse_args(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tmp  # before prometheus_client is imported
        step, write = measure(args.repeats)
    command = "python benchmarks/sglang/metrics_cost.py" + (
        f" --json {args.json}" if args.json else ""
    )
    shared.report(step, write, args, "counter update", command)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
