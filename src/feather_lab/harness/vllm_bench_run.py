"""One timed run of one engine at a held waiting-queue length, and its accounting.

After every engine step the queue is topped up again, so every timed `schedule()` call sees
the same number waiting. At the end every request left is aborted, and the run checks that
all are accounted for and that the schedulers (and Feather's CHT) are empty, so the next run
starts clean.
"""

from __future__ import annotations

import cProfile
import statistics
from collections.abc import Sequence
from typing import Any

from feather_lab.harness.vllm_bench_probe import PassProbe
from feather_lab.harness.vllm_bench_spec import RequestStream, VllmPassSpec
from feather_sched.vllm.local import scheduler_of


def serve(llm, spec: VllmPassSpec, n: int, stream: RequestStream, probe: PassProbe) -> dict:
    """`warmup` + `steps` engine steps with `n` waiting before each; then every request left
    is aborted. Returns the run's accounting (raises if a request went missing)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine, sched = llm.llm_engine, scheduler_of(llm)
    params = SamplingParams(
        max_tokens=spec.output_len, ignore_eos=True, temperature=0.0, detokenize=False
    )
    added: list[str] = []
    finished: dict[str, int] = {}

    def top_up() -> None:
        for rid, prompt in stream.take(n - len(sched.waiting)):
            engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
            added.append(rid)

    top_up()
    for i in range(spec.warmup + spec.steps):
        probe.on = i >= spec.warmup
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = len(out.outputs[0].token_ids)
        top_up()
    probe.on = False
    waiting, running = len(sched.waiting), len(sched.running)
    engine.abort_request([rid for rid in added if rid not in finished])
    return account(sched, spec, added, finished, waiting, running)


def account(
    sched, spec: VllmPassSpec, added: list[str], finished: dict[str, int], waiting: int,
    running: int,
) -> dict[str, int]:  # fmt: skip
    """Every request added is finished with its whole output or was aborted from the queue or
    the running batch; both schedulers (and Feather's CHT) hold nothing afterwards."""
    short = [rid for rid, k in finished.items() if k != spec.output_len]
    aborted = len(added) - len(finished)
    problems = []
    if len(set(added)) != len(added) or not set(finished) <= set(added):
        problems.append("a request id was issued twice or finished without being added")
    if short:
        problems.append(f"{len(short)} finished without their {spec.output_len} tokens")
    if aborted != waiting + running:
        problems.append(f"{aborted} unfinished but {waiting} waiting + {running} running")
    if sched.requests or len(sched.waiting) or sched.running:
        problems.append("the scheduler still holds requests after the aborts")
    tracker = getattr(getattr(sched, "feather", None), "index", None)
    if tracker is not None and (len(tracker) or tracker.num_tracked):
        problems.append(f"Feather's tracker still holds {tracker.num_tracked} requests")
    if problems:
        raise RuntimeError("vllm-bench run lost track of requests: " + "; ".join(problems))
    return {
        "added": len(added),
        "finished": len(finished),
        "aborted_waiting": waiting,
        "aborted_running": running,
    }


def run_once(
    llm,
    spec: VllmPassSpec,
    n: int,
    vocab: int,
    label: str,
    profiler: cProfile.Profile | None = None,
) -> dict[str, Any]:
    """One timed run of one engine at `n` waiting: per-step medians and the accounting
    (with `profiler`, profiled inside the scheduler's timed calls)."""
    from feather_sched.policies.registry import make_policy

    sched = scheduler_of(llm)
    feather = getattr(sched, "feather", None)
    if feather is not None:
        feather.policy = make_policy(spec.policy)  # a fresh policy per run
    llm.reset_prefix_cache()
    probe = PassProbe(sched, profiler)
    if feather is not None:
        probe.watch_policy(feather.policy)
    try:
        books = serve(llm, spec, n, RequestStream(spec, vocab, f"{label}-"), probe)
    finally:
        probe.close()
    row = {
        "schedule_us": _median_us(probe.schedule_s),
        "schedule_mean_us": statistics.fmean(probe.schedule_s) * 1e6,
        "update_us": _median_us(probe.update_s),
        "add_request_us": probe.add_s / max(1, probe.adds) * 1e6,
        "served_per_step": _served(books, spec),
        **books,
    }
    if feather is not None:
        row |= {
            "feather_part_us": _median_us(probe.feather_in_schedule_s),
            "feather_part_mean_us": statistics.fmean(probe.feather_in_schedule_s) * 1e6,
            "feather_policy_us": _median_us(probe.policy_in_schedule_s),
            "feather_host_us": _median_us(
                [f - p for f, p in zip(probe.feather_in_schedule_s, probe.policy_in_schedule_s)]
            ),
            "vllm_part_us": _median_us(
                [t - f for t, f in zip(probe.schedule_s, probe.feather_in_schedule_s)]
            ),
            "feather_in_update_us": _median_us(probe.feather_in_update_s),
            "feather_in_add_request_us": probe.feather_in_add_s / max(1, probe.adds) * 1e6,
            "feather_hook_calls_per_step": probe.hook_calls / spec.steps,
            "feather_hooks_us_per_step": {
                name: t / spec.steps * 1e6 for name, t in sorted(probe.hook_s.items())
            },
            "resyncs": feather.stats.resyncs,
            "policy_errors": feather.stats.policy_errors,
        }
    return row


def _median_us(values: Sequence[float]) -> float:
    return statistics.median(values) * 1e6


def _served(books: dict[str, int], spec: VllmPassSpec) -> float:
    """Requests admitted and not sent back per step, over the run's steps (finished, or
    running at the end)."""
    return (books["finished"] + books["aborted_running"]) / (spec.warmup + spec.steps)
