"""Clocks around a live vLLM scheduler's calls and, in the Feather engine, Feather's own code.

`schedule()`, `update_from_output()` and `add_request()` are timed on this thread's CPU clock
(vLLM's CPU forward leaves OpenMP threads that process CPU time would also count). Feather's
hooks are timed on `time.perf_counter`: a thread-CPU read costs about a microsecond, too much
for microsecond hooks, and the hooks run on this thread without sleeping.
"""

from __future__ import annotations

import cProfile
import time
from collections.abc import Callable, Iterator
from typing import Any

HOOKS = (
    "begin_schedule",
    "end_schedule",
    "has_next",
    "peek",
    "pop",
    "on_enqueue",
    "on_dequeue",
    "on_cache_lookup",
    "on_finished",
    "step_feedback",
)
"""The admission controller's methods vLLM reaches (vllm/admission.py)."""


class PassProbe:
    """Thread-CPU clocks around a live scheduler's `schedule`, `update_from_output` and
    `add_request`; for a Feather scheduler also wall clocks around Feather's hooks (summed
    into `feather_s`, split by the outer call they ran in). Instance attributes shadow the
    class's methods; `close()` removes them."""

    def __init__(self, sched, profiler: cProfile.Profile | None = None) -> None:
        self.sched = sched
        self.on = False
        self.profiler = profiler
        """Enabled inside the timed calls only (timings then carry its overhead)."""
        self.schedule_s: list[float] = []
        self.feather_in_schedule_s: list[float] = []
        self.policy_in_schedule_s: list[float] = []
        self.update_s: list[float] = []
        self.feather_in_update_s: list[float] = []
        self.add_s = 0.0
        self.feather_in_add_s = 0.0
        self.adds = 0
        self.feather_s = 0.0
        self.policy_s = 0.0
        """Of `feather_s`, the seconds inside the policy's own methods (`watch_policy`)."""
        self.hook_calls = 0
        self.hook_s: dict[str, float] = {}
        """Seconds in each Feather hook over the timed steps (arrivals included)."""
        self._hook_clock, self._policy_clock = _Outermost(), _Outermost()
        self._patched: list[tuple[Any, str]] = []
        self._wrap(
            sched,
            "schedule",
            self._outer(self.schedule_s, self.feather_in_schedule_s, self.policy_in_schedule_s),
        )
        self._wrap(sched, "update_from_output",
                   self._outer(self.update_s, self.feather_in_update_s, []))  # fmt: skip
        self._wrap(sched, "add_request", self._arrival)
        controller = getattr(sched, "feather", None)
        if controller is not None:
            for name in HOOKS:
                self._wrap(controller, name, self._hook(name))
            self._wrap(sched, "_prefill_tokens", self._hook("_prefill_tokens"))

    def _wrap(self, obj: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        setattr(obj, name, make(getattr(obj, name)))
        self._patched.append((obj, name))

    def close(self) -> None:
        for obj, name in reversed(self._patched):
            delattr(obj, name)
        self._patched.clear()

    def watch_policy(self, policy: Any) -> None:
        """Time the policy's own methods too (they run inside the hooks): what of Feather's
        part is the policy's decisions, and what the host's bookkeeping."""
        for name in ("follows_queue_order", "begin_step", "accept", "end_step"):
            self._wrap(policy, name, self._policy_call)
        self._wrap(policy, "candidates", self._policy_candidates)

    def _in_policy(self, fn: Callable, *args, **kwargs) -> Any:
        """fn(*args, **kwargs), its time added to `policy_s` unless a policy method called
        it (a policy calling its own methods is counted once)."""
        return self._policy_clock.run(fn, args, kwargs, self._policy_done)

    def _policy_done(self, seconds: float) -> None:
        self.policy_s += seconds

    def _policy_call(self, fn: Callable) -> Callable:
        return lambda *args, **kwargs: self._in_policy(fn, *args, **kwargs)

    def _policy_candidates(self, fn: Callable) -> Callable:
        return lambda *args, **kwargs: self._timed_iter(
            self._in_policy(lambda: iter(fn(*args, **kwargs)))
        )

    def _timed_iter(self, it: Iterator[str]) -> Iterator[str]:
        try:
            while (item := self._in_policy(next, it, None)) is not None:
                yield item
        finally:  # the host closes the candidates: close the policy's generator with them
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def _outer(
        self, cpu: list[float], feather: list[float], policy: list[float]
    ) -> Callable[[Callable], Callable]:
        def make(fn: Callable) -> Callable:
            def timed(*args, **kwargs):
                f0, p0, t0 = self.feather_s, self.policy_s, time.thread_time()
                out = self._call(fn, args, kwargs)
                t = time.thread_time() - t0
                if self.on:
                    cpu.append(t)
                    feather.append(self.feather_s - f0)
                    policy.append(self.policy_s - p0)
                return out

            return timed

        return make

    def _arrival(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            f0, t0 = self.feather_s, time.thread_time()
            out = self._call(fn, args, kwargs)
            if self.on:
                self.add_s += time.thread_time() - t0
                self.feather_in_add_s += self.feather_s - f0
                self.adds += 1
            return out

        return timed

    def _call(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        if self.profiler is None or not self.on:
            return fn(*args, **kwargs)
        self.profiler.enable()
        try:
            return fn(*args, **kwargs)
        finally:
            self.profiler.disable()

    def _hook(self, name: str) -> Callable[[Callable], Callable]:
        def done(seconds: float) -> None:  # a hook inside a hook is counted by the outer
            self.feather_s += seconds
            if self.on:
                self.hook_s[name] = self.hook_s.get(name, 0.0) + seconds
                self.hook_calls += 1

        def make(fn: Callable) -> Callable:
            return lambda *args, **kwargs: self._hook_clock.run(fn, args, kwargs, done)

        return make


class _Outermost:
    """Wall seconds of wrapped calls, a call made inside another wrapped call counted once,
    by the outermost (a hook calling a hook, a policy method calling its own)."""

    def __init__(self) -> None:
        self.depth = 0

    def run(self, fn: Callable, args: tuple, kwargs: dict, done: Callable[[float], None]) -> Any:
        self.depth += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.depth -= 1
            if self.depth == 0:
                done(time.perf_counter() - t0)
