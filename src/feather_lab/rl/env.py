"""FeatherEnv: the Feather bandit's ADD/STOP decision as a gymnasium environment.

An episode is one simulated run (fresh workload seed per reset, so `reset(seed=s)` replays
it); a step is one decision `FeatherPolicy` would ask (every other admission is automatic, as
in the policy). Reward: sequences served beyond FCFS's decode rate over the decode steps until
the next decision, `(b - rho * dt) / B`, so an episode's return grows exactly as decode time
shrinks, however many decisions it asks; `info["engine_steps"]` lets a learner discount per
engine step. The simulator runs in a worker thread that alternates strictly with the agent
over two queues, so an episode is deterministic; `reset`/`close` abort an unfinished worker."""

from __future__ import annotations

import itertools
import queue
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from feather_lab.rl import TRAIN_HARDWARE, TRAIN_MODEL
from feather_lab.sim.config import EngineConfig
from feather_lab.sim.engine import simulate
from feather_lab.sim.result import SimResult
from feather_lab.workloads import make_workload
from feather_lab.workloads.base import Workload
from feather_sched.cost.resolve import resolve_cost
from feather_sched.cost.step_model import BatchShape, StepCostModel
from feather_sched.policies.bandit import ADD, STOP
from feather_sched.policies.base import is_decode_step
from feather_sched.policies.fcfs import FCFSPolicy
from feather_sched.policies.observation import OBS_DIM, DelegatedFeather
from feather_sched.policies.starvation import MAX_WAIT_S
from feather_sched.request import Request

__all__ = ["ADD", "STOP", "FeatherEnv", "baseline_throughput", "decode_throughput"]

_ABORT = object()
_thread_ids = itertools.count()


class _Aborted(Exception):
    """Raised inside the simulator thread to end an episode the env no longer wants."""


class _BridgePolicy(DelegatedFeather):
    """Hands each decision to the env thread and waits for its action."""

    name = "feather-env"

    def __init__(self, max_wait_s: float, to_env: queue.Queue, to_sim: queue.Queue) -> None:
        # The agent's STOPs act unbounded in training (the environment its weights learned
        # in); the shipped policy bounds its holds at run time (policies/hold.py).
        super().__init__(max_wait_s=max_wait_s, max_hold_steps=None)
        self._to_env = to_env
        self._to_sim = to_sim
        self._seqs = 0
        self._seconds = 0.0
        self._steps = 0

    def take_window(self) -> tuple[int, float, int]:
        """Sequences served and seconds spent in decode-dominated steps since the last call,
        and the number of engine steps of any kind."""
        window = (self._seqs, self._seconds, self._steps)
        self._seqs, self._seconds, self._steps = 0, 0.0, 0
        return window

    def choose(self, observation: np.ndarray) -> int:
        self._to_env.put(("decision", observation, self.take_window(), None))
        action = self._to_sim.get()
        if action is _ABORT:
            raise _Aborted
        return action

    def end_step(self, view, step_time: float, batch_size: int, prefill_tokens: int = 0) -> None:
        super().end_step(view, step_time, batch_size, prefill_tokens)
        self._steps += 1
        if step_time > 0 and is_decode_step(batch_size, prefill_tokens):
            self._seqs += batch_size
            self._seconds += step_time


def _simulate_in_thread(
    requests: list[Request],
    policy: _BridgePolicy,
    cost: StepCostModel,
    engine: EngineConfig,
    to_env: queue.Queue,
) -> None:
    """Worker body. Module-level (not a bound method) so the thread holds no env reference."""
    try:
        result = simulate(requests, policy, cost, engine)
    except _Aborted:
        return
    except BaseException as err:  # hand every failure to the env thread
        to_env.put(("error", None, (0, 0.0, 0), err))
        return
    to_env.put(("done", None, policy.take_window(), result))


def decode_throughput(result: SimResult) -> float:
    """Sequences/s over a run's decode-dominated steps (the steps the reward counts)."""
    steps = result.steps
    mask = steps["prefill_tokens"] <= steps["batch"]
    seconds = float(steps["duration"][mask].sum())
    return float(steps["batch"][mask].sum()) / seconds if seconds > 0 else 0.0


def baseline_throughput(
    requests: list[Request], cost: StepCostModel, engine: EngineConfig
) -> float:
    """FCFS's decode throughput on these requests: the reward's reference rate."""
    rate = decode_throughput(simulate(requests, FCFSPolicy(), cost, engine))
    if rate > 0:
        return rate
    # no decode-dominated step at all: fall back to an ideal step of the engine's batch
    batch = max(1, min(engine.max_num_seqs, len(requests)))
    return batch / cost.step_time(BatchShape(num_decode=batch))


class FeatherEnv(gym.Env):
    """Feather's ADD/STOP decisions over simulated runs (see the module docstring).

    `workload`: a workload name (with `workload_config` overrides), a `Workload`, or a
    sequence of them (a training mix; one is drawn per reset). `cost`: the step-cost model
    (None: the shipped weights' profiles, `TRAIN_HARDWARE` + `TRAIN_MODEL`);
    `engine` sets the simulated engine's limits.
    `max_tries`: episodes to draw per reset before giving up when they ask no decision
    at all (e.g. a workload without sharing).
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self,
        workload: str | Workload | Sequence[str | Workload] = "long-prefix",
        workload_config: dict[str, Any] | None = None,
        *,
        cost: StepCostModel | None = None,
        engine: EngineConfig | None = None,
        max_wait_s: float = MAX_WAIT_S,
        max_tries: int = 8,
    ) -> None:
        super().__init__()
        items = [workload] if isinstance(workload, str | Workload) else list(workload)
        if not items:
            raise ValueError("FeatherEnv needs at least one workload")
        if workload_config and len(items) > 1:
            raise ValueError("workload_config applies to a single named workload")
        self.workloads: list[Workload] = [
            make_workload(w, **(workload_config or {})) if isinstance(w, str) else w for w in items
        ]
        if cost is None:
            cost = resolve_cost(TRAIN_HARDWARE, TRAIN_MODEL)
        self.cost = cost
        self.engine = engine or EngineConfig()
        self.max_wait_s = max_wait_s
        self.max_tries = max_tries
        self.observation_space = spaces.Box(0.0, 1.0, shape=(OBS_DIM,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.last_result: SimResult | None = None
        self.episode_info: dict[str, Any] = {}
        self._thread: threading.Thread | None = None
        self._to_sim: queue.Queue | None = None
        self._to_env: queue.Queue | None = None
        self._finalizer: weakref.finalize | None = None
        self._batch = 1
        self._rho = 1.0
        self._last_obs = np.zeros(OBS_DIM, dtype=np.float32)

    # ------------------------------------------------------------------ gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._stop_worker()
        self.last_result = None
        for _ in range(self.max_tries):
            which = int(self.np_random.integers(len(self.workloads)))
            episode_seed = int(self.np_random.integers(2**31 - 1))
            requests = self.workloads[which].generate(episode_seed)
            if not requests:
                continue
            kind, obs, _window, payload = self._start_worker(requests)
            if kind == "decision":
                self._last_obs = obs
                self.episode_info = {
                    "workload": type(self.workloads[which]).__name__,
                    "workload_index": which,
                    "episode_seed": episode_seed,
                    "requests": len(requests),
                }
                return obs, dict(self.episode_info)
            self._join_worker()
            if kind == "error":
                raise RuntimeError("the simulation failed") from payload
        raise RuntimeError(
            f"{self.max_tries} episodes in a row asked no ADD/STOP decision (workloads without "
            f"shared prefixes never do): {[type(w).__name__ for w in self.workloads]}"
        )

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._thread is None:
            raise RuntimeError("FeatherEnv.step before reset (or after the episode ended)")
        act = int(action)
        if act not in (ADD, STOP):
            raise ValueError(f"action must be 0 (ADD) or 1 (STOP), got {action!r}")
        assert self._to_sim is not None and self._to_env is not None
        self._to_sim.put(act)
        kind, obs, window, payload = self._to_env.get()
        reward = self._reward(window)
        info: dict[str, Any] = {"engine_steps": window[2]}
        if kind == "decision":
            self._last_obs = obs
            return obs, reward, False, False, info
        self._join_worker()
        if kind == "error":
            raise RuntimeError("the simulation failed") from payload
        result: SimResult = payload
        self.last_result = result
        info["output_tok_s"] = result.output_tok_s
        info["makespan_s"] = result.makespan_s
        info["requests"] = len(result.records)
        return self._last_obs, reward, True, False, info

    def close(self) -> None:
        self._stop_worker()
        super().close()

    # ------------------------------------------------------------------ internals
    def _reward(self, window: tuple[int, float, int]) -> float:
        """(sequences served - FCFS decode throughput x seconds) / batch."""
        seqs, seconds, _ = window
        return float((seqs - self._rho * seconds) / self._batch)

    def _start_worker(self, requests: list[Request]) -> tuple[str, Any, Any, Any]:
        self._batch = max(1, min(self.engine.max_num_seqs, len(requests)))
        self._rho = baseline_throughput(requests, self.cost, self.engine)
        to_env: queue.Queue = queue.Queue()
        to_sim: queue.Queue = queue.Queue()
        policy = _BridgePolicy(self.max_wait_s, to_env, to_sim)
        thread = threading.Thread(
            target=_simulate_in_thread,
            args=(requests, policy, self.cost, self.engine, to_env),
            name=f"feather-env-{next(_thread_ids)}",
            daemon=True,
        )
        self._thread, self._to_env, self._to_sim = thread, to_env, to_sim
        # If the env is dropped mid-episode, release the blocked worker.
        self._finalizer = weakref.finalize(self, to_sim.put, _ABORT)
        thread.start()
        return to_env.get()

    def _join_worker(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._thread is not None:
            self._thread.join()
        self._thread = self._to_sim = self._to_env = self._finalizer = None

    def _stop_worker(self) -> None:
        """End an unfinished episode: the worker is blocked waiting for an action."""
        if self._thread is not None and self._thread.is_alive():
            assert self._to_sim is not None
            self._to_sim.put(_ABORT)
        self._join_worker()
