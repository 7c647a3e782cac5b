"""Feather inside vLLM V1: scheduler classes loadable with vLLM's own `scheduler_cls`.

    LLM(model, scheduler_cls="feather_sched.integrations.vllm.FeatherScheduler")
    vllm serve MODEL --scheduler-cls feather_sched.integrations.vllm.FeatherScheduler

Configuration (read when the engine builds its scheduler):

- `FEATHER_POLICY`: a policy name from `feather_sched.policies.registry` (default "feather"
  when registered, else "grouped"). Any registered policy works: fcfs, lpm, grouped, ...
- `FEATHER_POLICY_OPTIONS`: JSON object of the policy's keyword options, e.g. '{"max_batch": 8}'.
- `FEATHER_CHUNK_BLOCKS`: CHT chunk size in KV blocks (default 1: chunk == block).
- `FEATHER_POLICY_STATE`: a file for the policy's learned state (the feather bandit's table):
  loaded at start if it exists, saved every `FEATHER_POLICY_STATE_EVERY_S` seconds of serving
  (default 60) and at shutdown, so a restarted server starts warm.

What it changes: only the order in which waiting requests are admitted and where admission
stops (see `vllm_admission`); vLLM still runs every request it admits exactly as before, so
greedy outputs are unchanged. `FeatherScheduler` picks `FeatherAsyncScheduler` by itself when
vLLM runs with async scheduling (the GPU default; vllm/config/vllm.py), so one class name
serves both; the async one can also be named directly.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from feather_sched.integrations.engine_index import EngineIndex
from feather_sched.integrations.vllm_admission import (
    AdmissionController,
    AdmissionStats,
    FeatherRequestQueue,
)
from feather_sched.policies.base import Policy
from feather_sched.policies.registry import make_policy, policy_names

__all__ = [
    "FeatherAsyncScheduler",
    "FeatherScheduler",
    "default_policy_name",
    "policy_from_env",
]

logger = logging.getLogger("feather_sched.vllm")

ENV_POLICY = "FEATHER_POLICY"
ENV_OPTIONS = "FEATHER_POLICY_OPTIONS"
ENV_CHUNK_BLOCKS = "FEATHER_CHUNK_BLOCKS"
ENV_STATE = "FEATHER_POLICY_STATE"
ENV_STATE_EVERY = "FEATHER_POLICY_STATE_EVERY_S"


def default_policy_name() -> str:
    """The "feather" policy once it is registered, else the prefix-grouping baseline."""
    return "feather" if "feather" in policy_names() else "grouped"


def policy_from_env() -> Policy:
    """The policy named by FEATHER_POLICY with FEATHER_POLICY_OPTIONS (fails loudly: a typo
    must not silently run another policy)."""
    name = os.environ.get(ENV_POLICY, "").strip() or default_policy_name()
    raw = os.environ.get(ENV_OPTIONS, "").strip()
    try:
        options = json.loads(raw) if raw else {}
    except json.JSONDecodeError as err:
        raise ValueError(f"{ENV_OPTIONS} is not valid JSON: {err}") from None
    if not isinstance(options, dict):
        raise ValueError(f"{ENV_OPTIONS} must be a JSON object, got {raw!r}")
    state = os.environ.get(ENV_STATE, "").strip()
    if state and Path(state).is_file():
        options.setdefault("policy_state", state)
    policy = make_policy(name, **options)
    if state and not _keeps_state(policy):
        raise ValueError(f"{ENV_STATE} is set but policy {name!r} keeps no learned state")
    return policy


def _keeps_state(policy: Policy) -> bool:
    """Policies with learned state save it with `save(path)` (the feather bandit)."""
    return callable(getattr(policy, "save", None))


def _state_saver_from_env() -> PolicyStateSaver | None:
    path = os.environ.get(ENV_STATE, "").strip()
    if not path:
        return None
    raw = os.environ.get(ENV_STATE_EVERY, "").strip() or "60"
    try:
        every = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_STATE_EVERY} must be a number of seconds, got {raw!r}") from None
    if every <= 0:
        raise ValueError(f"{ENV_STATE_EVERY} must be > 0, got {raw!r}")
    return PolicyStateSaver(Path(path), every)


class PolicyStateSaver:
    """Saves a policy's learned state to a file every `every_s` seconds (checked once per
    engine step, so the cost is a clock read) and on demand. A failed save is logged, never
    raised: serving must not stop because a disk is full."""

    def __init__(self, path: Path, every_s: float, clock=time.monotonic) -> None:
        self.path = path
        self.every_s = every_s
        self._clock = clock
        self._last = clock()
        self.saves = 0

    def maybe_save(self, policy: Policy) -> None:
        if self._clock() - self._last >= self.every_s:
            self.save(policy)

    def save(self, policy: Policy) -> None:
        self._last = self._clock()
        if not _keeps_state(policy):
            return  # a stateless policy was swapped in at run time: nothing to keep
        try:
            policy.save(self.path)  # type: ignore[attr-defined]
            self.saves += 1
        except Exception:
            logger.exception("feather: could not save the policy state to %s", self.path)


def _chunk_blocks_from_env() -> int:
    raw = os.environ.get(ENV_CHUNK_BLOCKS, "").strip() or "1"
    value = int(raw)
    if value < 1:
        raise ValueError(f"{ENV_CHUNK_BLOCKS} must be >= 1, got {raw!r}")
    return value


class FeatherScheduler(Scheduler):
    """vLLM's Scheduler with feather's admission policy on its waiting queue.

    Hooks (vLLM 0.32, vllm/v1/core/sched/scheduler.py): `self.waiting` is wrapped in
    `FeatherRequestQueue` (arrivals via `_enqueue_waiting_request`, preemption via
    `_preempt_request` -> `prepend_request`, aborts via `finish_requests` ->
    `remove_requests`, the admission loop in `schedule`); `_free_request` (every finish and
    abort) drops the request from the CHT; `update_from_output` feeds the step's duration and
    batch size back to the policy (`Policy.end_step`).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> FeatherScheduler:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        sched_config = getattr(vllm_config, "scheduler_config", None)
        target = cls
        if cls is FeatherScheduler and getattr(sched_config, "async_scheduling", False):
            target = FeatherAsyncScheduler
        return super().__new__(target)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        policy = policy_from_env()
        index = EngineIndex(self.hash_block_size, _chunk_blocks_from_env())
        self.feather = AdmissionController(self, policy, index)
        self.feather_state = _state_saver_from_env()
        self.waiting = FeatherRequestQueue(self.waiting, self.feather)
        self._feather_steps: dict[int, tuple[float, int]] = {}
        self._feather_last_done = 0.0
        logger.info(
            "feather scheduler: policy %r, CHT chunk %d tokens (%s)",
            policy.name,
            index.cht.chunk_size,
            type(self).__name__,
        )

    @property
    def feather_stats(self) -> AdmissionStats:
        return self.feather.stats

    def schedule(self, *args: Any, **kwargs: Any):
        start = time.perf_counter()
        self.feather.begin_schedule()
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self.feather.end_schedule()  # even if vLLM raised: the next step must not start armed
        if output.total_num_scheduled_tokens > 0:
            if len(self._feather_steps) > 64:  # outputs vLLM never reported back (defensive)
                self._feather_steps.clear()
            self._feather_steps[id(output)] = (start, self._prefill_tokens(output))
        return output

    def _prefill_tokens(self, output) -> int:
        """Tokens of this step that are prompt (or recompute) work, not decode: a request
        whose computed tokens lagged its tokens by more than the one being decoded."""
        total = 0
        requests = self.requests
        for rid, n in output.num_scheduled_tokens.items():
            req = requests.get(rid)
            # _update_after_schedule already advanced num_computed_tokens by n.
            if req is not None and req.num_computed_tokens - n < req.num_tokens - 1:
                total += n
        return total

    def update_from_output(self, scheduler_output, model_runner_output):
        result = super().update_from_output(scheduler_output, model_runner_output)
        step = self._feather_steps.pop(id(scheduler_output), None)
        if step is not None:
            # Step time = from when this step could start (its schedule() call, or the end of
            # the previous step when steps overlap under async scheduling) to its output.
            start, prefill_tokens = step
            done = time.perf_counter()
            self.feather.step_feedback(
                done - max(start, self._feather_last_done),
                len(scheduler_output.num_scheduled_tokens),
                prefill_tokens,
            )
            self._feather_last_done = done
            if self.feather_state is not None:
                self.feather_state.maybe_save(self.feather.policy)
        return result

    def shutdown(self) -> None:
        if self.feather_state is not None:
            self.feather_state.save(self.feather.policy)
        super().shutdown()

    def _free_request(self, request, *args: Any, **kwargs: Any):
        result = super()._free_request(request, *args, **kwargs)
        self.feather.on_finished(request.request_id)
        return result


class FeatherAsyncScheduler(FeatherScheduler, AsyncScheduler):
    """The same, over vLLM's AsyncScheduler (vllm/v1/core/sched/async_scheduler.py): use it
    when async scheduling is on (the GPU default), where the sync Scheduler costs latency."""
