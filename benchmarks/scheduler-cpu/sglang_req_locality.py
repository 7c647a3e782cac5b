"""Does SGLang's per-request work over a batch cost more when the batch's `Req` objects were
created far apart in one burst (a prefix-grouped pick) than when they were created together
(fcfs: the next 224 in arrival order)? Real `Req` objects of SGLang 0.5.23; thread CPU.
benchmarks/scheduler-cpu/README.md, "Feather's extra CPU at 10,000 waiting".

Usage (SGLang's environment): PYTHONPATH=src python benchmarks/scheduler-cpu/sglang_req_locality.py
"""

from __future__ import annotations

import random
import statistics
import time
from array import array

from feather_sched.sglang.cpu import prepare_cpu_import

N, BATCH, GROUPS, BATCH_GROUPS = 10_000, 224, 64, 9


def burst(rng: random.Random) -> tuple[list, list[int]]:
    """N requests created one after another, as SGLang creates a burst of arrivals."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs, other = [], []
    for i in range(N):
        sp = SamplingParams(max_new_tokens=128)
        sp.normalize(None)
        ids = array("q", [rng.randrange(512) for _ in range(2000)])
        reqs.append(Req(f"r{i}", "", ids, sp, vocab_size=512))
        other.append(bytes(600))  # the burst's other allocations (its messages)
    group = [rng.randrange(GROUPS) for _ in range(N)]  # shuffled traffic
    return reqs, group


def step_work(batch: list, rounds: int = 128) -> float:
    """Thread-CPU ms a decode step spends on per-request attribute traffic over `batch`."""
    c0 = time.thread_time()
    for t in range(rounds):
        for r in batch:
            r.output_ids.append(t)
        sum(r.seqlen for r in batch)
        [r for r in batch if not r.finished()]
        any(r.return_hidden_states for r in batch)
        sum(1 for r in batch if r.return_logprob)
    for r in batch:
        del r.output_ids[-rounds:]
    return (time.thread_time() - c0) / rounds * 1e3


def main() -> None:
    prepare_cpu_import()
    rng = random.Random(0)
    reqs, group = burst(rng)
    res: dict[str, list[float]] = {"fcfs": [], "grouped": []}
    for k in range(20):
        res["fcfs"].append(step_work(reqs[k * BATCH : (k + 1) * BATCH]))
        picked = set(rng.sample(range(GROUPS), BATCH_GROUPS))
        members = [r for r, g in zip(reqs, group, strict=True) if g in picked]
        res["grouped"].append(step_work(rng.sample(members, min(BATCH, len(members)))))
    for name, v in res.items():
        print(
            f"{name}: median {statistics.median(v):.3f} ms/step over {len(v)} batches "
            f"(min {min(v):.3f}, max {max(v):.3f})"
        )


if __name__ == "__main__":
    main()
