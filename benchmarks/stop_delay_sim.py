"""What the STOP delay bound (`stop_delay_share`, policies/hold.py `StopDelay`) does on the
simulator: `feather` without the bound and with it, beside fcfs and max-homogeneous, on the
suite's workloads, per hardware profile (benchmarks/replay.md, "A server that keeps
learning": why the bound is an option, not the default).

    python benchmarks/stop_delay_sim.py --hardware h200,h100-free-l2 \
        --json benchmarks/stop-delay-sim.json

Simulated (each profile's provenance is in the record); the rows are `feather_sched.simulate`'s,
the same engine settings as `feather bench` (the suite's `max_num_seqs` per workload).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from feather_sched.api import simulate
from feather_sched.bench.machine import write_record
from feather_sched.cost.resolve import resolve_cost
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.hold import StopDelay
from feather_sched.workloads.presets import PRESETS

MODEL = "llama-3.1-8b"
FIELDS = ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "policy_stops")


def rows(hardware: str, share: float) -> list[dict[str, Any]]:
    """Every suite workload under fcfs, max-homogeneous, feather and feather with the bound."""
    cost = resolve_cost(hardware, MODEL)
    out = []
    for workload in PRESETS["sim"]:
        runs = {
            "fcfs": "fcfs",
            "max-homogeneous": "max-homogeneous",
            "feather": FeatherPolicy(cost=cost),
            f"feather stop_delay_share={share}": FeatherPolicy(cost=cost, stop_delay_share=share),
        }
        for label, policy in runs.items():
            s = simulate(workload, policy, hardware=hardware, model=MODEL).summary()
            row = {"hardware": hardware, "workload": workload, "policy": label}
            row.update({k: s.get(k) for k in FIELDS})
            out.append(row)
            print(f"{hardware:<14}{workload:<14}{label:<32}{s['output_tok_s']:>10.0f} tok/s"
                  f"  TTFT p99 {s['ttft_p99_s']:.2f} s", flush=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", default="h200,h100-free-l2")
    parser.add_argument("--share", type=float, default=0.2)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    hardware = [h for h in args.hardware.split(",") if h]
    try:  # bad input fails here, before any run
        StopDelay(args.share)
        provenance = {h: resolve_cost(h, MODEL).hardware.provenance for h in hardware}
    except ValueError as err:
        parser.error(str(err))
    found = [r for h in hardware for r in rows(h, args.share)]
    config = {"hardware": hardware, "provenance": provenance, "model": MODEL, "share": args.share}
    write_record(args.json, config=config, rows=found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
