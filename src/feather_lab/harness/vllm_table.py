"""The real-engine policy table: every policy on vLLM's CPU engine, with and without EOS.

Blocks of `run_vllm_bench`, one per (KV scenario, output mode): the workloads run to their
full output length (`ignore_eos`, as every other real-engine record here) in each KV
scenario, then the same workloads with their output length as a cap, ending at the model's
EOS (`eos`, harness/eos_walk.py), in the scenarios asked for. Within a block the repeats are
interleaved across workloads and policies (`vllm_suite`). The record is rewritten after each
block, so a long run that stops keeps what it finished (`complete`: false).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from feather_lab.harness.vllm_spec import VllmBenchSpec

TABLE_POLICIES = (
    "vllm-cache-aware",
    "feather",
    "feather-hold",
    "feather-paper",
    "feather-upstream",
)
"""Beside vLLM's own scheduler (`vllm`, FCFS), which always runs first as the baseline."""
PRIOR_POLICIES = ("feather", "feather-hold")
"""The policies that take the step-cost prior (`--feather-hardware`)."""


@dataclass(frozen=True)
class Block:
    scenario: str
    ignore_eos: bool

    @property
    def name(self) -> str:
        return f"{self.scenario}{'' if self.ignore_eos else ', eos'}"


@dataclass(frozen=True)
class TableSpec:
    """What the table runs: the bench spec (its scenarios, all of them) and which of its
    scenarios also run ending at EOS."""

    bench: VllmBenchSpec
    eos_scenarios: Sequence[str]

    def blocks(self) -> list[Block]:
        names = [s.name for s in self.bench.resolved().scenarios or ()]
        return [Block(n, True) for n in names] + [Block(n, False) for n in self.eos_scenarios]

    def validate(self) -> None:
        """Every name checked before an engine starts (ValueError names the bad value)."""
        self.bench.validate()
        known = [s.name for s in self.bench.resolved().scenarios or ()]
        bad = [s for s in self.eos_scenarios if s not in known]
        if bad:
            raise ValueError(f"--eos-scenarios {bad}: valid: {', '.join(known)}")

    def block_spec(self, block: Block) -> VllmBenchSpec:
        bench = self.bench.resolved()
        scenario = next(s for s in bench.scenarios or () if s.name == block.scenario)
        return dataclasses.replace(bench, scenarios=(scenario,), ignore_eos=block.ignore_eos)


class Eta:
    """Progress and time left: each remaining run is priced at the mean duration of the
    finished runs most like it (same block and workload, else same workload, else any)."""

    def __init__(
        self, spec: TableSpec, out: Callable[[str], None], blocks: Sequence[Block] | None = None
    ) -> None:
        bench = spec.bench.resolved()
        blocks = spec.blocks() if blocks is None else blocks
        per_workload = 1 + len(bench.policies)
        # vllm_suite's order within a block: repeats, then workloads, then policies
        self.plan = [
            (block.name, w)
            for block in blocks
            for _ in range(bench.repeats)
            for w in bench.workloads or ()
            for _ in range(per_workload)
        ]
        self.blocks = len(blocks)
        self.done: list[tuple[str, str, float]] = []
        self.startups: list[float] = []
        """Seconds from each block's start to its first run (its engines start and warm up)."""
        self._block_start: float | None = None
        self.out = out
        self.t0 = time.perf_counter()
        self._current: tuple[str, str, float] | None = None

    def tick(self, block: Block, label: str) -> None:
        """A run starts (`label`: scenario/workload/policy/repeat): the last one ended."""
        now = time.perf_counter()
        self.close(now)
        if self._block_start is not None:
            self.startups.append(now - self._block_start)
            self._block_start = None
        self._current = (block.name, label.split("/")[1], now)
        left = self.left()
        self.out(
            f"[{len(self.done) + 1}/{len(self.plan)}] {block.name}: {label}  "
            f"elapsed {_clock(now - self.t0)}, ETA {'?' if left is None else _clock(left)}"
        )

    def start_block(self) -> None:
        """A block starts: its engines are built before its first run."""
        self.close()
        self._block_start = time.perf_counter()

    def close(self, now: float | None = None) -> None:
        """The running run ended (also at the end of a block: engine start-up is not a run)."""
        if self._current is not None:
            name, workload, start = self._current
            self.done.append((name, workload, (now or time.perf_counter()) - start))
            self._current = None

    def left(self) -> float | None:
        """Seconds of runs still to do, the one starting now included; None before any."""
        if not self.done:
            return None
        runs = sum(self._mean(b, w) for b, w in self.plan[len(self.done) :])
        startup = sum(self.startups) / max(1, len(self.startups))
        return runs + startup * (self.blocks - len(self.startups))

    def _mean(self, block: str, workload: str) -> float:
        for match in (
            [d for b, w, d in self.done if b == block and w == workload],
            [d for _, w, d in self.done if w == workload],
            [d for _, _, d in self.done],
        ):
            if match:
                return sum(match) / len(match)
        return 0.0


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s"


def run_table(
    spec: TableSpec,
    save: Callable[[list[dict[str, Any]], bool], None],
    out: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    kept: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Every block in turn; `save(rows, complete)` after each. EOS rows are labelled
    `workload (scenario, eos)`. `kept`: rows of an earlier run of the same table; a block
    they hold is not run again (the record is saved only between blocks)."""
    from feather_lab.harness.vllm_suite import run_vllm_bench

    spec.validate()
    have = {_block_of(row) for row in kept}
    blocks = [b for b in spec.blocks() if b not in have]
    rows = [row for row in kept if _block_of(row) in set(spec.blocks())]
    eta = Eta(spec, out, blocks)
    for i, block in enumerate(blocks):
        out(f"block {i + 1}/{len(blocks)}: {block.name} (starting its engines)")
        eta.start_block()
        got = run_vllm_bench(
            spec.block_spec(block), on_progress=lambda label, b=block: eta.tick(b, label)
        )
        for row in got:
            row["outputs"] = "ignore_eos" if block.ignore_eos else "eos"
            # what the KV gate and the policy could know of each output: its length, or a cap
            row["scheduler_sees_output"] = "exact" if block.ignore_eos else "cap"
            row["workload"] = f"{row['engine_workload']} ({block.name})"
        rows.extend(got)
        save(rows, i == len(blocks) - 1)
    if not blocks:
        save(rows, True)
    return rows


def _block_of(row: dict[str, Any]) -> Block:
    return Block(row["scenario"], row.get("outputs", "ignore_eos") == "ignore_eos")
