"""The scheduler's CPU on the simulated clock (`EngineConfig.scheduler_cpu`).

vLLM's async scheduling and SGLang's overlap loop (both on by default on a GPU) form the next
batch while the GPU runs this one, so a step takes the longer of CPU and GPU; a synchronous
loop takes their sum (`EngineConfig.async_scheduling`). Modes: `model` prices the policy's
pass, admissions and arrivals with `sim.scheduler_cpu`; `measured` charges the policy's
Python CPU as timed here (host-dependent, not reproducible); `off` charges nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from feather_lab.sim.scheduler_cpu import CpuRow, check_mode, load_scheduler_cpu


@dataclass(slots=True)
class SchedCpuClock:
    """One run's scheduler CPU: what the step being formed has spent, and the totals."""

    mode: str
    row: CpuRow | None
    async_scheduling: bool
    pending_s: float = 0.0
    """CPU of the step being formed (arrivals, the pass), charged when it is costed."""
    total_cpu_s: float = 0.0
    total_step_s: float = 0.0
    cpu_bound_steps: int = 0
    steps: int = 0

    @classmethod
    def for_run(cls, mode: str, policy: str, async_scheduling: bool) -> SchedCpuClock | None:
        """The clock of a run of `policy`; None when the mode is off."""
        if check_mode(mode) == "off":
            return None
        row = load_scheduler_cpu().for_policy(policy) if mode == "model" else None
        return cls(mode, row, async_scheduling)

    def arrived(self, n: int) -> None:
        """`n` requests entered the waiting queue (Feather hashes each into its CHT)."""
        if self.row is not None:
            self.pending_s += self.row.arrivals_s(n)

    def passed(self, policy_s: float, waiting: int, admitted: int) -> None:
        """A pass over `waiting` requests admitted `admitted`; `policy_s` is the policy's
        own CPU in it as timed (what `measured` charges)."""
        if self.row is None:
            self.pending_s += policy_s
        else:
            self.pending_s += self.row.pass_s(waiting, admitted)

    def step(self, gpu_s: float) -> float:
        """The step's duration: its GPU time combined with the CPU charged since the last
        step by the engine's overlap rule."""
        cpu = self.pending_s
        self.pending_s = 0.0
        dt = max(gpu_s, cpu) if self.async_scheduling else gpu_s + cpu
        self.total_cpu_s += cpu
        self.total_step_s += dt
        self.cpu_bound_steps += cpu > gpu_s
        self.steps += 1
        return dt

    def summary(self) -> dict[str, float | str]:
        """The row's fields: the CPU's share of step time, CPU per step, and the share of
        steps where the CPU took longer than the GPU."""
        steps = max(1, self.steps)
        share = self.total_cpu_s / self.total_step_s if self.total_step_s > 0 else 0.0
        return {
            "sched_cpu_share": share,
            "sched_cpu_ms_per_step": self.total_cpu_s / steps * 1e3,
            "sched_cpu_bound_steps": self.cpu_bound_steps / steps,
        }
