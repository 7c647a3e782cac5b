"""SGLang's own loop, each policy against fcfs over whole rounds of `feather bench --engine sglang`.

`feather bench --engine sglang` runs each policy in its own scheduler process, one after the
other, so a policy's repeats are not interleaved with fcfs's: a slower minute on a shared
machine lands on one policy only. Each round here is one whole bench (every policy, both KV
scenarios); the record keeps every round and, per row, the median over rounds of the
round's own ratio to fcfs, with its spread.

    python benchmarks/sglang/loop_rounds.py --rounds 3 \
        --json benchmarks/sglang/loop-deferral-skip.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from feather_lab.bench.record import guard, write_record

BENCH = ["-w", "shared-prefix,no-sharing", "--policies", "fcfs,grouped,feather", "--repeats", "3"]


def run_round(i: int, rounds: int, scratch: Path) -> list[dict]:
    out = scratch / f"round-{i}.json"
    argv = [sys.executable, "-m", "feather_lab.cli", "bench", "--engine", "sglang", *BENCH]
    print(f"round {i + 1}/{rounds}: {' '.join(argv[3:])}", flush=True)
    subprocess.run([*argv, "--json", str(out), "--allow-dirty"], check=True)
    return json.loads(out.read_text())["rows"]


def summarize(rounds: list[list[dict]]) -> list[dict]:
    """Per (workload, policy): the median over rounds of output tok/s over fcfs's of the same
    round and scenario, with its lowest and highest."""
    rows = []
    for i, first in enumerate(rounds[0]):
        ratios = []
        for rows_of_round in rounds:
            row = rows_of_round[i]
            fcfs = next(
                r
                for r in rows_of_round
                if r["workload"] == row["workload"] and r["policy"] == "fcfs"
            )
            ratios.append(row["output_tok_s"] / fcfs["output_tok_s"])
        rows.append(
            {
                "workload": first["workload"],
                "policy": first["policy"],
                "vs_fcfs": round(statistics.median(ratios), 3),
                "vs_fcfs_rounds": [round(r, 3) for r in ratios],
                "output_tok_s": round(statistics.median(r[i]["output_tok_s"] for r in rounds), 1),
            }
        )
    return rows


def main() -> None:
    guard()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    with tempfile.TemporaryDirectory() as tmp:
        rounds = [run_round(i, args.rounds, Path(tmp)) for i in range(args.rounds)]
    write_record(
        args.json,
        config={"bench": ["feather", "bench", "--engine", "sglang", *BENCH], "rounds": args.rounds},
        rows=summarize(rounds),
        rounds=rounds,
    )
    for row in summarize(rounds):
        print(
            f"{row['workload']:<28} {row['policy']:<8} x fcfs {row['vs_fcfs']:.3f} "
            f"(rounds {', '.join(f'{r:.3f}' for r in row['vs_fcfs_rounds'])})"
        )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
