"""Feather inside vLLM V1: scheduler classes loadable with vLLM's own `scheduler_cls`.

    LLM(model, scheduler_cls="feather_sched.vllm.FeatherScheduler")
    vllm serve MODEL --scheduler-cls feather_sched.vllm.FeatherScheduler

Configuration: `feather_sched.settings` (read when the engine builds its scheduler; the same
variables as the SGLang plugin): `FEATHER_POLICY` (default `feather`; `off` keeps vLLM's own
order), `FEATHER_POLICY_OPTIONS`, `FEATHER_CHUNK_TOKENS` (rounded down to whole KV blocks, at
least one), `FEATHER_POLICY_STATE` and `FEATHER_POLICY_STATE_EVERY_S` (the learned state is
loaded at start, saved while serving and at shutdown, so a restarted server starts warm).

Supported vLLM releases: `host/versions.py` (tested on 0.32; 0.33 and 0.34 checked name
by name against their source); the scheduler refuses to start on any other version.

What it changes: only the order in which waiting requests are admitted and where admission
stops (see `vllm_admission`); vLLM still runs every request it admits exactly as before, so
greedy outputs are unchanged. `FEATHER_POLICY=vllm-cache-aware` reproduces vLLM 0.34's
`--cache-aware-admission-window` (`_reorder_waiting_by_cached_prefix`) on releases without it
(policies/vllm_cache_aware.py; `FEATHER_POLICY_OPTIONS='{"window": N, "threshold": T}'`).
`FeatherScheduler` picks `FeatherAsyncScheduler` by itself when
vLLM runs with async scheduling (the GPU default; vllm/config/vllm.py), so one class name
serves both; the async one can also be named directly.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from feather_sched import __version__
from feather_sched.host.admission import HostStats
from feather_sched.host.metrics import MetricsPublisher
from feather_sched.host.tracker import RequestTracker, chunk_blocks
from feather_sched.host.versions import SUPPORTED, check_engine_version
from feather_sched.policies.base import Policy
from feather_sched.policies.registry import make_policy
from feather_sched.settings import ENV, FeatherSettings
from feather_sched.vllm.admission import AdmissionController, FeatherRequestQueue

__all__ = ["FeatherAsyncScheduler", "FeatherScheduler"]

logger = logging.getLogger("feather_sched.vllm")


def _log_through_vllm() -> None:
    """Feather's lines in vLLM's log, in vLLM's format: vLLM configures only its own `vllm`
    logger, so Feather's would otherwise drop everything below a warning."""
    ours, theirs = logging.getLogger("feather_sched"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.getEffectiveLevel())
    ours.propagate = False


def start_line(settings: FeatherSettings, policy: str, chunk: int, cls: str) -> str:
    """The one line that says, in the engine's log, that Feather schedules, how, for which
    vLLM releases, and how to turn it off."""
    options = json.dumps(dict(settings.policy_options), sort_keys=True)
    if settings.enabled:
        what = f"policy {policy!r}, options {options}"
        switch = f"turn off: {ENV['policy']}=off, or leave out --scheduler-cls"
    else:
        what = f"policy off ({ENV['policy']}=off): vLLM's own order"
        switch = f"turn on: unset {ENV['policy']}"
    return (
        f"feather scheduler: {what}, CHT chunk {chunk} tokens ({cls}); Feather {__version__} "
        f"for vLLM {SUPPORTED['vllm'].specifier}; {switch}"
    )


def _policy(settings: FeatherSettings) -> Policy:
    """The configured policy; `off` is vLLM's own order (fcfs leaves every step to it)."""
    return settings.make_policy() if settings.enabled else make_policy("fcfs")


class FeatherScheduler(Scheduler):
    """vLLM's Scheduler with feather's admission policy on its waiting queue.

    Hooks (vLLM 0.32, vllm/v1/core/sched/scheduler.py): `self.waiting` is wrapped in
    `FeatherRequestQueue` (arrivals via `_enqueue_waiting_request`, preemption via
    `_preempt_request` -> `prepend_request`, aborts via `finish_requests` ->
    `remove_requests`, the admission loop in `schedule`); `_free_request` (every finish and
    abort) drops the request from the CHT; `update_from_output` feeds the step's duration and
    batch size back to the policy (`Policy.end_step`); `_get_local_prefix_cache_hit` (vLLM's
    prefix-cache lookup as it admits) hands its hit to the KV gate's put-off probe (where a
    release lacks it, the admitted request's computed tokens stand in).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> FeatherScheduler:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        sched_config = getattr(vllm_config, "scheduler_config", None)
        target = cls
        if cls is FeatherScheduler and getattr(sched_config, "async_scheduling", False):
            target = FeatherAsyncScheduler
        return super().__new__(target)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_engine_version("vllm")  # the adapter relies on vLLM internals: fail at startup
        _log_through_vllm()
        super().__init__(*args, **kwargs)
        settings = FeatherSettings.from_env()
        policy = _policy(settings)
        blocks = chunk_blocks(settings.chunk_tokens, self.hash_block_size)
        index = RequestTracker(self.hash_block_size, blocks)
        self.feather = AdmissionController(self, policy, index)
        self.feather_state = settings.state_saver()
        if settings.enabled and getattr(self, "cache_aware_window", 0):
            # vLLM >= 0.34's --cache-aware-admission-window reorders the queue head by cache
            # hit each step; Feather orders the whole queue, so the two would undo each other.
            logger.warning("feather: vLLM's cache-aware admission window is off (Feather orders)")
            self.cache_aware_window = 0
        self.waiting = FeatherRequestQueue(self.waiting, self.feather)
        self._feather_steps: dict[int, tuple[float, int]] = {}
        self._feather_last_done = 0.0
        name = policy.name if settings.enabled else "off"
        self.feather_metrics = MetricsPublisher.from_env(name)
        logger.info(start_line(settings, name, index.cht.chunk_size, type(self).__name__))

    @property
    def feather_stats(self) -> HostStats:
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
            self.feather_metrics.observe_groups(self.feather.index.cht.num_running_roots)
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
        if self.feather_metrics.due(idle=not self.requests):
            self.feather_metrics.publish(self.feather.stats, self._kv_holds())
        return result

    def _kv_holds(self) -> int:
        return int(getattr(self.feather.policy, "kv_refusals", 0))

    def shutdown(self) -> None:
        self.feather_metrics.publish(self.feather.stats, self._kv_holds())
        if self.feather_state is not None:
            self.feather_state.save(self.feather.policy)
        super().shutdown()

    def _get_local_prefix_cache_hit(self, request, *args: Any, **kwargs: Any):
        """vLLM's own prefix-cache lookup for a request it is admitting: its hit is what the
        KV gate's put-off probe of that request reads (one lookup serves both)."""
        result = super()._get_local_prefix_cache_hit(request, *args, **kwargs)
        self.feather.on_cache_lookup(request.request_id, result[1])
        return result

    def _free_request(self, request, *args: Any, **kwargs: Any):
        result = super()._free_request(request, *args, **kwargs)
        self.feather.on_finished(request.request_id)
        return result


class FeatherAsyncScheduler(FeatherScheduler, AsyncScheduler):
    """The same, over vLLM's AsyncScheduler (vllm/v1/core/sched/async_scheduler.py): use it
    when async scheduling is on (the GPU default), where the sync Scheduler costs latency."""
