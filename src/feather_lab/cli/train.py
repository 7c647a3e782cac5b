"""`feather train`: the feather-ppo policy trained with PPO on the simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from feather_lab.bench.suite import DEFAULT_HARDWARE
from feather_lab.cli.common import (
    app,
    console,
    fail,
    names,
    writable,
)
from feather_lab.cli.options import Hardware, Kernel, TrainMaxNumSeqs, TrainWorkloads
from feather_sched.cost import resolve_cost


@app.command("train")
def train_cmd(
    workload: TrainWorkloads = None,
    steps: Annotated[int, typer.Option(min=1, help="PPO steps (ADD/STOP decisions).")] = 100_000,
    out: Annotated[Path, typer.Option(help="Where to write the weights (.npz).")] = Path(
        "feather_ppo.npz"
    ),
    seed: Annotated[int, typer.Option(help="Training seed (PPO and episode draws).")] = 0,
    hardware: Hardware = DEFAULT_HARDWARE,
    model: Annotated[str, typer.Option(help="Model profile name or JSON file.")] = "llama-3-8b",
    kernel: Kernel = "paged",
    max_num_seqs: TrainMaxNumSeqs = None,
) -> None:
    """Train the feather-ppo policy (PPO on the simulator) and save its weights.

    Use the result with FEATHER_PPO_WEIGHTS=PATH (e.g. for `feather bench`), or copy it over
    src/feather_sched/policies/weights/feather_ppo.npz to ship it. Needs the `rl` extra.
    """
    from feather_lab.rl.train import RLMissingError, TrainConfig, require_rl, train

    writable(out=out)
    try:
        require_rl()
    except RLMissingError as err:
        fail(err)
    try:
        mix = _training_mix(names(workload), max_num_seqs)
        cost = resolve_cost(hardware, model, kernel)  # bad profiles fail here, before any work
    except (ValueError, FileNotFoundError) as err:
        fail(err)
    config = TrainConfig(steps=steps, seed=seed, hardware=hardware, model=model, kernel=kernel)
    try:
        report = train(out, config, mix, cost=cost)
    except RuntimeError as err:
        fail(err)
    _print_training(report)


def _training_mix(names: list[str], max_num_seqs: int | None) -> list[Any]:
    """The training workloads: 'mix' (or none named) is the built-in mix; any other name runs
    with the bench suite's engine settings unless --max-num-seqs says otherwise. Each is built
    once here, so an unknown name fails before training starts."""
    from feather_lab.rl.train import DEFAULT_MIX, MixEntry

    mix: list[MixEntry] = []
    for name in names or ["mix"]:
        if name == "mix":
            mix.extend(DEFAULT_MIX)
        else:
            entry = MixEntry(name, max_num_seqs=max_num_seqs or _suite_max_num_seqs(name))
            entry.build()
            mix.append(entry)
    return mix


def _print_training(report: Any) -> None:
    """What training did, and whether it learned: the mean episode throughput of the first
    and the last quarter of episodes (shown once there are at least four)."""
    curve = report.episode_tok_s
    console.print(
        f"trained {report.steps:,} decisions over {report.episodes} episodes in "
        f"{report.seconds:,.0f} s; wrote {report.out}"
    )
    if len(curve) >= 4:
        k = max(1, len(curve) // 4)
        first, last = sum(curve[:k]) / k, sum(curve[-k:]) / k
        console.print(
            f"episode output tok/s (mixed workloads): first {k} {first:,.0f}, last {k} {last:,.0f}"
        )


def _suite_max_num_seqs(workload: str) -> int:
    """The bench suite's max_num_seqs for a workload (what `feather bench` runs it with)."""
    from feather_lab.bench.suite import SUITE

    suite = SUITE.get(workload)
    return int(suite.engine.get("max_num_seqs", 256)) if suite else 256
