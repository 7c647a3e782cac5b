"""`feather vllm-bench`: the CPU of one vLLM `schedule()` with vLLM's own scheduler and with
Feather's, at long waiting queues (harness/vllm_bench.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from feather_lab.bench.record import write_record
from feather_lab.cli.common import app, console, err_console, fail, int_list, writable
from feather_lab.cli.options import (
    MaxBatchedTokens,
    OptionalJsonOut,
    PassKvBlocks,
    PassMaxNumSeqs,
    PassPolicy,
    PassProfile,
    PassRepeats,
    PassSizes,
    PassSteps,
    PassWarmup,
    Seed,
)
from feather_lab.harness.vllm_spec import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS

_TABLE = (
    ("waiting", "n_waiting", "{:,}"),
    ("vLLM schedule() us", "vllm_schedule_us", "{:.0f}"),
    ("Feather schedule() us", "feather_schedule_us", "{:.0f}"),
    ("Feather's part us", "feather_part_us", "{:.0f}"),
    ("part / vLLM's", "feather_part_vs_vllm", "{:.1%}"),
    ("means: part / vLLM's", "feather_part_mean_vs_vllm", "{:.1%}"),
    ("added / vLLM's", "feather_added_vs_vllm", "{:.1%}"),
    ("arrival us (vLLM / Feather's part)", None, None),
)


PASSED_ON = (
    "repeats",
    "steps",
    "warmup",
    "policy",
    "kv_blocks",
    "max_num_seqs",
    "max_num_batched_tokens",
    "seed",
)
"""Options the spec takes under their own names."""


@app.command("vllm-bench")
def vllm_bench_cmd(
    sizes: PassSizes = "1000,10000",
    repeats: PassRepeats = 5,
    steps: PassSteps = 40,
    warmup: PassWarmup = 8,
    policy: PassPolicy = "feather",
    kv_blocks: PassKvBlocks = 1024,
    max_num_seqs: PassMaxNumSeqs = MAX_NUM_SEQS,
    max_num_batched_tokens: MaxBatchedTokens = MAX_NUM_BATCHED_TOKENS,
    seed: Seed = 0,
    json_out: OptionalJsonOut = None,
    profile: PassProfile = None,
) -> None:
    """CPU of vLLM's schedule() with its own scheduler vs Feather's (needs the 'vllm' extra),
    at long waiting queues: Feather's part measured directly and as the difference."""
    from feather_lab.harness.vllm_bench import run_vllm_pass
    from feather_lab.harness.vllm_bench_spec import VllmPassSpec

    opts = dict(locals())
    writable(json=json_out)
    spec = VllmPassSpec(sizes=tuple(int_list(sizes, "--sizes")), **{k: opts[k] for k in PASSED_ON})
    try:
        spec.validate()
    except ValueError as err:
        fail(err)
    if importlib.util.find_spec("vllm") is None:
        fail(RuntimeError("vllm-bench needs vLLM: pip install -e '.[vllm]' (see pyproject.toml)"))
    if profile is not None and profile.exists() and not profile.is_dir():
        fail(ValueError(f"--profile {profile} exists and is not a folder"))
    rows = run_vllm_pass(
        spec,
        on_progress=lambda label: err_console.print(f"[dim]{label}[/dim]"),
        profile_dir=profile,
    )
    console.print(_table(rows))
    if json_out is not None:
        _write(json_out, spec, rows)


def _write(json_out: Path, spec: Any, rows: list[dict]) -> None:
    write_record(
        json_out,
        benchmark="vllm schedule() CPU",
        command="feather vllm-bench " + " ".join(sys.argv[2:]),
        vllm=_vllm_version(),
        spec=dataclasses.asdict(spec),
        results=rows,
    )
    console.print(f"wrote {json_out}")


def _table(rows: list[dict]) -> Table:
    table = Table(title="vLLM schedule(): thread CPU per call, medians over runs")
    for title, _, _ in _TABLE:
        table.add_column(title, justify="right")
    for row in rows:
        cells = [fmt.format(row[key]) for _, key, fmt in _TABLE if key is not None]
        arrival = f"{row['vllm_add_request_us']:.0f} / {row['feather_in_add_request_us']:.0f}"
        table.add_row(*cells, arrival)
    return table


def _vllm_version() -> str:
    import vllm

    return vllm.__version__
