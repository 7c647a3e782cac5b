"""Feather as an SGLang plugin: CHT ordering and ADD/STOP inside SGLang's own scheduler.

SGLang loads every function registered under the entry point group `sglang.srt.plugins`
(`SGLANG_PLUGINS`, when set, whitelists them by name); Feather's is `feather` -> `register()`,
which patches four methods (`HOOK_TARGETS`) through SGLang's `HookRegistry`. Supported
releases: host/versions.py (from 0.5.22, where `Scheduler.get_prefill_adder_class` appears).
Feather is on when `SGLANG_PLUGINS` names it or `FEATHER_POLICY` is set (config:
`feather_sched.settings`); off, no hook is registered and SGLang runs exactly as shipped.
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from collections.abc import Mapping
from typing import Any

from feather_sched.host.versions import check_engine_version
from feather_sched.settings import DEFAULT_POLICY, ENV, FeatherSettings
from feather_sched.sglang.queue import Offer, SGLangQueue
from feather_sched.sglang.series import series_for

logger = logging.getLogger("feather_sched.sglang")

PLUGIN_NAME = "feather"

_SCHEDULE_POLICY = "sglang.srt.managers.schedule_policy.SchedulePolicy"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
HOOK_TARGETS = (
    f"{_SCHEDULE_POLICY}.__init__",
    f"{_SCHEDULE_POLICY}.calc_priority",
    f"{_SCHEDULER}.get_prefill_adder_class",
    f"{_SCHEDULER}.get_next_batch_to_run",
)


def settings_from_env(environ: Mapping[str, str] | None = None) -> FeatherSettings:
    """Feather's settings in an SGLang process: off unless `SGLANG_PLUGINS` names the
    plugin or `FEATHER_POLICY` is set."""
    env = os.environ if environ is None else environ
    named = PLUGIN_NAME in {p.strip() for p in env.get("SGLANG_PLUGINS", "").split(",")}
    return FeatherSettings.from_env(env, default_policy=DEFAULT_POLICY if named else None)


# SchedulePolicy -> its queue, or None when Feather stays out of that scheduler.
_QUEUES: weakref.WeakKeyDictionary[Any, SGLangQueue | None] = weakref.WeakKeyDictionary()
# queue -> its `feather_*` series, or None where SGLang's metrics are off (series.py).
_SERIES: weakref.WeakKeyDictionary[SGLangQueue, Any] = weakref.WeakKeyDictionary()


def register() -> None:
    """Entry point `feather` in group `sglang.srt.plugins`: register the hooks if enabled."""
    config = settings_from_env()
    if not config.enabled:
        logger.info(
            "Feather plugin loaded but off (set %s or SGLANG_PLUGINS=%s)",
            ENV["policy"],
            PLUGIN_NAME,
        )
        return
    config.make_policy()  # fail at load on a bad name/option
    try:
        check_engine_version("sglang")  # Scheduler.get_prefill_adder_class needs >= 0.5.22
    except RuntimeError:
        # SGLang logs a plugin's exception and serves without it: say so first.
        logger.error("Feather plugin not loaded: SGLang runs without it")
        raise
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    init, calc, adder, step = HOOK_TARGETS
    HookRegistry.register(init, _after_policy_init, HookType.AFTER)
    HookRegistry.register(calc, _around_calc_priority, HookType.AROUND)
    HookRegistry.register(adder, _around_prefill_adder_class, HookType.AROUND)
    HookRegistry.register(step, around_next_batch, HookType.AROUND)
    logger.info(
        "Feather plugin on: policy %r, CHT chunk %d tokens", config.policy, config.chunk_tokens
    )


def queue_for(schedule_policy: Any) -> SGLangQueue | None:
    """The Feather queue of an SGLang `SchedulePolicy` (created on first use), or None."""
    if schedule_policy is None:
        return None
    try:
        return _QUEUES[schedule_policy]
    except KeyError:
        queue = _attach(schedule_policy, settings_from_env())
        _QUEUES[schedule_policy] = queue
        return queue
    except TypeError:  # not weak-referenceable: not a SchedulePolicy
        return None


def _attach(schedule_policy: Any, config: FeatherSettings) -> SGLangQueue | None:
    if not config.enabled:
        return None
    if getattr(schedule_policy, "enable_priority_scheduling", False):
        logger.warning(
            "Feather stays off: priority scheduling is on and Feather ignores request priorities"
        )
        return None
    tree_cache = getattr(schedule_policy, "tree_cache", None)
    queue = SGLangQueue(
        config.make_policy(),
        chunk_tokens=config.chunk_tokens,
        block_size=int(getattr(tree_cache, "page_size", 1) or 1),
        tree_cache=tree_cache,
    )
    saver = queue.state_saver = config.state_saver()
    if saver is not None:
        atexit.register(lambda: saver.save(queue.policy))  # the scheduler process exits
    return queue


# ---------------------------------------------------------------------------- hooks
def _after_policy_init(result: Any, schedule_policy: Any, *args: Any, **kwargs: Any) -> None:
    """Build the queue with the scheduler, so a bad config fails at startup, not mid-run."""
    _QUEUES.pop(schedule_policy, None)
    queue_for(schedule_policy)


def _around_calc_priority(
    original: Any,
    schedule_policy: Any,
    waiting_queue: list,
    running_batch: Any = None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Instead of SGLang's ordering: sync the CHT with the lists and put the policy's first
    candidate at the list head (`SGLangQueue.begin_pass`)."""
    queue = queue_for(schedule_policy)
    if queue is None:
        return original(schedule_policy, waiting_queue, running_batch, *args, **kwargs)
    running = None if running_batch is None else running_batch.reqs
    queue.begin_pass(waiting_queue, running)
    _touch_waiting_prefixes(schedule_policy, waiting_queue)
    return None


def _touch_waiting_prefixes(schedule_policy: Any, waiting_queue: list) -> None:
    """Keep SGLang's LRU refresh of waiting prefixes, as its fcfs pass does
    (`SchedulePolicy._touch_waiting_prefixes`, every 32nd pass, the first 128 waiting)."""
    touch = getattr(schedule_policy, "_touch_waiting_prefixes", None)
    if touch is None:
        return
    from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy

    touch(CacheAgnosticPolicy.FCFS, waiting_queue)


def _around_prefill_adder_class(original: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """Feather's adder on top of whatever class SGLang (or another plugin) returns, and the
    scheduler's batch limits read into the policy's view."""
    base = original(scheduler, *args, **kwargs)
    queue = queue_for(getattr(scheduler, "policy", None))
    if queue is None:
        return base
    max_running = getattr(scheduler, "max_running_requests", None)
    if max_running:  # the batch limits the policy's view reports (`GroupingJudge` reads both)
        queue.max_num_seqs = int(max_running)
        queue.max_num_batched_tokens = prefill_budget(scheduler)
        overlap = getattr(scheduler, "enable_overlap", None)
        queue.overlaps_cpu = None if overlap is None else bool(overlap)
    return feather_adder_class(base, queue)


def prefill_budget(scheduler: Any) -> int | None:
    """Prompt tokens one prefill batch of `scheduler` may compute: its adder's input budget
    (`max_prefill_tokens`) and, with chunked prefill on, its chunk budget
    (`chunked_prefill_size`, None or <= 0 when off), the smaller; None if it says neither."""
    limits = (getattr(scheduler, a, None) for a in ("max_prefill_tokens", "chunked_prefill_size"))
    budgets = [int(v) for v in limits if isinstance(v, int) and v > 0]
    return min(budgets) if budgets else None


def around_next_batch(original: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """One call per event-loop iteration: the previous step's time goes to the policy before
    this iteration admits anything; an iteration with no batch syncs the CHT, so requests
    that finished leave it when the server goes idle, not at the next arrival."""
    queue = queue_for(getattr(scheduler, "policy", None))
    if queue is not None:
        queue.end_previous_step()  # before this iteration's admissions (see the method)
    plan = original(scheduler, *args, **kwargs)
    if queue is not None:
        batch = getattr(plan, "batch_to_run", plan)  # NextBatchPlan, or a batch (older)
        reqs = getattr(batch, "reqs", None) or ()
        mode = getattr(batch, "forward_mode", None)
        is_extend = mode is not None and mode.is_extend()
        prefill = int(getattr(batch, "extend_num_tokens", 0) or 0) if is_extend else 0
        queue.on_step(len(reqs), prefill)
        if batch is None:  # an idle iteration: forget what finished since the last pass
            running = getattr(plan, "running_batch", None) or getattr(
                scheduler, "running_batch", None
            )
            queue.on_idle(getattr(scheduler, "waiting_queue", ()), getattr(running, "reqs", None))
        if queue.state_saver is not None:
            queue.state_saver.maybe_save(queue.policy)
        _publish(scheduler, queue, has_batch=bool(reqs))
    return plan


def _publish(scheduler: Any, queue: SGLangQueue, has_batch: bool) -> None:
    """This iteration on Feather's `feather_*` series, where SGLang's metrics are on."""
    try:
        series = _SERIES[queue]
    except KeyError:
        series = _SERIES[queue] = series_for(scheduler, queue.policy.name)
    if series is None:
        return
    if has_batch:
        series.observe_groups(queue.index.num_running_roots)
    if series.due(idle=not has_batch):
        series.publish(queue.stats, int(getattr(queue.policy, "kv_refusals", 0)))


# ---------------------------------------------------------------------------- the adder
class FeatherAdderMixin:
    """ADD/STOP and lazy candidate order on top of SGLang's `PrefillAdder.add_one_req`.

    SGLang's adder still decides whether a request fits (token budget, KV pool, slots): the
    policy only gets to say STOP before it is asked, and picks which request is offered next.
    STOP returns `AddReqResult.OTHER`, what SGLang's adder returns at `prefill_max_requests`.
    """

    _feather_queue: SGLangQueue
    _feather_stop: Any
    _feather_continue: Any
    _feather_has_room: bool  # the base adder reports `rem_total_tokens`

    def add_one_req(self, req: Any, *args: Any, **kwargs: Any) -> Any:
        # Positional calls: once an offer each, keywords cost more than the readability
        # they buy (before_offer: nothing admitted yet, room; after_offer: added, proceed,
        # chunked).
        queue = self._feather_queue
        can_run = self.can_run_list  # type: ignore[attr-defined]
        room = self._feather_room if self._feather_has_room else None
        offer = queue.before_offer(req, not can_run, room)
        if offer is not Offer.TRY:  # SGLang's loop breaks on STOP, goes on after CONTINUE
            return self._feather_stop if offer is Offer.STOP else self._feather_continue
        result = super().add_one_req(req, *args, **kwargs)  # type: ignore[misc]
        added = bool(can_run) and can_run[-1] is req
        chunked = getattr(self, "new_chunked_req", None) is req
        queue.after_offer(req, added, result == self._feather_continue, chunked)
        return result

    def _feather_room(self) -> float:
        """KV tokens left after the running requests' growth (read only when needed)."""
        return self.rem_total_tokens  # type: ignore[attr-defined]

    def add_chunked_req(self, req: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().add_chunked_req(req, *args, **kwargs)  # type: ignore[misc]
        self._feather_queue.note_chunked(req, still_chunked=result is not None)
        return result


def feather_adder_class(base: type, queue: SGLangQueue) -> type:
    """`base` (SGLang's PrefillAdder or a plugin's subclass of it) with Feather on top,
    bound to `queue`; one class per (base, queue)."""
    cached = queue.adder_classes.get(base)
    if cached is not None:
        return cached
    from sglang.srt.managers.schedule_policy import AddReqResult

    cls = type(
        f"Feather{base.__name__}",
        (FeatherAdderMixin, base),
        {
            "_feather_queue": queue,
            "_feather_stop": AddReqResult.OTHER,
            "_feather_continue": AddReqResult.CONTINUE,
            "_feather_has_room": hasattr(base, "rem_total_tokens"),
            "__module__": __name__,
        },
    )
    queue.adder_classes[base] = cls
    return cls
