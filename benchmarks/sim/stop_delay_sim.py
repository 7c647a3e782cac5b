"""What the STOP delay bound (`stop_delay_share`, policies/hold.py `StopDelay`) does on the
simulator: `feather` as it is built (the bound at its default), without the bound
(`stop_delay_share=None`) and, with `--share`, at another share, beside fcfs and
max-homogeneous, on the suite's workloads, per hardware profile (benchmarks/replay/README.md,
"A server that keeps learning" and "The STOP delay bound by default").

    python benchmarks/sim/stop_delay_sim.py --hardware h200,h100,a100,h100-free-l2 \
        --json benchmarks/sim/stop-delay-sim-net.json

Simulated (each profile's provenance is in the record); the rows are `feather_sched.simulate`'s,
the same engine settings as `feather bench` (the suite's `max_num_seqs` per workload).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from feather_lab.api import simulate
from feather_lab.bench.record import write_record
from feather_lab.workloads.presets import PRESETS
from feather_sched.cost.resolve import resolve_cost
from feather_sched.policies.feather import FeatherPolicy
from feather_sched.policies.hold import STOP_DELAY_SHARE, StopDelay

MODEL = "llama-3.1-8b"
FIELDS = ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "policy_stops")


def rows(hardware: str, share: float | None) -> list[dict[str, Any]]:
    """Every suite workload under fcfs, max-homogeneous, feather, feather without the bound
    and (given a `share`) feather with that share."""
    cost = resolve_cost(hardware, MODEL)
    out = []
    for workload in PRESETS["sim"]:
        runs: dict[str, Any] = {
            "fcfs": "fcfs",
            "max-homogeneous": "max-homogeneous",
            "feather": FeatherPolicy(cost=cost),
            "feather stop_delay_share=None": FeatherPolicy(cost=cost, stop_delay_share=None),
        }
        if share is not None:
            runs[f"feather stop_delay_share={share}"] = FeatherPolicy(
                cost=cost, stop_delay_share=share
            )
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
    parser.add_argument("--share", type=float, default=None, help="a share to run beside")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    hardware = [h for h in args.hardware.split(",") if h]
    try:  # bad input fails here, before any run
        StopDelay(args.share)
        provenance = {h: resolve_cost(h, MODEL).hardware.provenance for h in hardware}
    except ValueError as err:
        parser.error(str(err))
    found = [r for h in hardware for r in rows(h, args.share)]
    config = {
        "hardware": hardware,
        "provenance": provenance,
        "model": MODEL,
        "default_share": STOP_DELAY_SHARE,
        "share": args.share,
    }
    write_record(args.json, config=config, rows=found)
    return 0


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    raise SystemExit(main())
