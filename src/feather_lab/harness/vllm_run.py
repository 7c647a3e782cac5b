"""One run of a request list on a warm vLLM engine, and its result row.

Requests are added at their arrival times and the engine is stepped until all finish; TTFT is
taken at the step that returned a request's first token. The process's CPU time is recorded
too (`output_tok_cpu_s`): on a shared machine it is the steadier comparison.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from feather_lab.harness.vllm_steps import StepProbe
from feather_lab.sim.result import preemption_spread
from feather_sched.request import Request
from feather_sched.vllm.local import scheduler_of


def run_once(
    llm,
    requests: Sequence[Request],
    label: str,
    record_shapes: bool = False,
    ignore_eos: bool = True,
) -> dict[str, Any]:
    """Serve `requests` (at their arrival times) on a warm engine; one result row.
    `busy_s` is the measured time of its engine steps; with `record_shapes` the row also
    carries `step_shapes` (each step's BatchShape, for replaying the run through a cost
    model; not JSON: pop it before saving). Without `ignore_eos` a request's output length
    is its cap and it ends at EOS; the row then says how long the outputs were."""
    llm.reset_prefix_cache()
    order = sorted(requests, key=lambda r: r.arrival_time)
    run = _Run(llm.llm_engine, order, label, ignore_eos)
    with StepProbe(scheduler_of(llm), run.group.get, record_shapes) as probe:
        cpu_s = run.serve()
    run.check_finished()
    return run.row(probe, cpu_s)


class _Run:
    """One run of requests on one engine, and what happened to each (by the bench's request
    id): when it arrived, produced its first token and finished (with how many tokens), plus
    the time spent inside engine steps. Kept apart from the row so the timed loop does only
    bookkeeping."""

    def __init__(self, engine, order: Sequence[Request], label: str, ignore_eos: bool) -> None:
        self.engine = engine
        self.ignore_eos = ignore_eos
        self.tokens: dict[str, Sequence[int]] = {}
        """The bench's request id -> its output token ids (greedy: the same on every engine)."""
        self.order = order
        self.label = label
        self.external: dict[str, Request] = {}
        self.group: dict[str, str | None] = {}
        """Engine-internal request id -> prefix group, for the probe's group count."""
        self.arrived: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.done: dict[str, tuple[float, int]] = {}
        self.busy = 0.0
        self.t0 = 0.0
        self._next = 0

    def serve(self) -> float:
        """Add each request once its arrival time has passed and step the engine until all
        have finished (sleeping while it is idle); the process's CPU seconds for it."""
        engine, order = self.engine, self.order
        self.t0, cpu0 = time.perf_counter(), time.process_time()
        while self._next < len(order) or engine.has_unfinished_requests():
            self._add_arrived()
            if not engine.has_unfinished_requests():
                wake = self.t0 + order[self._next].arrival_time
                time.sleep(max(0.0, wake - time.perf_counter()))
                continue
            self._step()
        return time.process_time() - cpu0

    def _add_arrived(self) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        now = time.perf_counter()
        while self._next < len(self.order) and self.order[self._next].arrival_time <= now - self.t0:
            r = self.order[self._next]
            rid = f"{self.label}-{r.request_id}"
            params = SamplingParams(
                max_tokens=r.output_len,
                ignore_eos=self.ignore_eos,
                temperature=0.0,
                detokenize=False,
            )
            prompt = TokensPrompt(prompt_token_ids=r.prompt.tolist())
            internal = self.engine.add_request(rid, prompt, params)
            self.external[rid] = r
            self.group[internal] = r.group or internal
            self.arrived[rid] = self.t0 + r.arrival_time
            self._next += 1

    def _step(self) -> None:
        started = time.perf_counter()
        outs = self.engine.step()
        t = time.perf_counter()
        self.busy += t - started
        for out in outs:
            n = len(out.outputs[0].token_ids)
            if n and out.request_id not in self.first:
                self.first[out.request_id] = t
            if out.finished:
                self.done[out.request_id] = (t, n)
                key = self.external[out.request_id].request_id
                self.tokens[key] = tuple(out.outputs[0].token_ids)

    def check_finished(self) -> None:
        """A request that did not finish with its output length (under `ignore_eos`), or with
        1 to its cap tokens (ending at EOS), means the row's tokens are not the workload's:
        refuse the run rather than report it."""
        done = self.done

        def wrong(rid: str, r: Request) -> bool:
            n = done.get(rid, (0, -1))[1]
            return n != r.output_len if self.ignore_eos else not 1 <= n <= r.output_len

        bad = [rid for rid, r in self.external.items() if wrong(rid, r)]
        if bad:
            what = "their output length" if self.ignore_eos else "1 to their cap of tokens"
            raise RuntimeError(f"{len(bad)} requests did not finish with {what}: {bad[:3]}")

    def row(self, probe: StepProbe, cpu_s: float) -> dict[str, Any]:
        """The run's result row: throughput, latency percentiles and the probe's counts."""
        finish = max(t for t, _ in self.done.values())
        makespan = finish - min(self.arrived.values())
        ttft = np.array([self.first[rid] - self.arrived[rid] for rid in self.external])
        latency = np.array([self.done[rid][0] - self.arrived[rid] for rid in self.external])
        tokens = sum(n for _, n in self.done.values())
        steps = max(1, probe.steps)
        return {
            "requests": len(self.external),
            "output_tokens": tokens,
            "makespan_s": round(makespan, 4),
            "output_tok_s": round(tokens / makespan, 2),
            "cpu_s": round(cpu_s, 3),
            "output_tok_cpu_s": round(tokens / cpu_s, 2),
            "mean_batch": round(probe.batch / steps, 2),
            "mean_prefix_groups": round(probe.groups / steps, 2),
            "ttft_p50_s": round(float(np.percentile(ttft, 50)), 4),
            "ttft_p99_s": round(float(np.percentile(ttft, 99)), 4),
            "latency_p50_s": round(float(np.percentile(latency, 50)), 4),
            "sched_us_per_step": round(probe.sched_s / steps * 1e6, 2),
            "steps": probe.steps,
            "preemptions": probe.preempted.total(),
            **preemption_spread([probe.preempted[rid] for rid in self.group]),
            "preempted_kv_tokens": probe.preempted_kv_tokens,
            "busy_s": round(self.busy, 4),
            "ignore_eos": self.ignore_eos,
            **({} if self.ignore_eos else self.output_lengths()),
            **({"step_shapes": probe.shapes} if probe.shapes is not None else {}),
        }

    def output_lengths(self) -> dict[str, Any]:
        """The realised output lengths (ending at EOS) against the caps, and every request's
        output tokens (`output_token_ids`, by the workload's request id: not for JSON)."""
        n = np.array([self.done[rid][1] for rid in self.external])
        caps = np.array([r.output_len for r in self.external.values()])
        q = np.percentile(n, [0, 25, 50, 75, 100])
        return {
            "output_len_quartiles": [int(v) for v in np.round(q)],
            "output_len_mean": round(float(n.mean()), 2),
            "output_len_cap_mean": round(float(caps.mean()), 2),
            "output_at_cap": int((n == caps).sum()),
            "output_token_ids": dict(self.tokens),
        }
