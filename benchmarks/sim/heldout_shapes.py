"""Held-out-style shapes on the measured H200 profile: workloads built like the real traces the
project is checked on (not in the suite), simulated, every policy of the suite's comparison.

- docqa-long: 250 documents of 10,000 tokens x 4 questions, 128-token answers, Poisson 8/s
  (a long-context QA benchmark's shape: long documents, few questions each; KV-bound).
- docqa-few: 330 documents of 8,000 tokens x 3 questions, 200-token answers, Poisson 3/s
  (the same shape at a rate the KV cache holds).
- multi-turn: 64 conversations x 6 turns, 4,000-token first turns, 500-token user turns,
  256-token answers, 5 s think time, conversations starting Poisson 2/s.
Seeds 0-2. Usage: python benchmarks/sim/heldout_shapes.py OUT.json [--policies a,b,...]
"""

from __future__ import annotations

import argparse

from feather_lab import simulate
from feather_lab.bench.record import write_record
from feather_lab.workloads.registry import make_workload

SHAPES = {
    "docqa-long": (
        "document-qa",
        {
            "num_documents": 250,
            "document_len": 10000,
            "questions_per_document": 4,
            "output_len": 128,
            "arrival": "poisson:8",
        },
    ),
    "docqa-few": (
        "document-qa",
        {
            "num_documents": 330,
            "document_len": 8000,
            "questions_per_document": 3,
            "output_len": 200,
            "arrival": "poisson:3",
        },
    ),
    "multi-turn": (
        "multi-turn",
        {
            "num_conversations": 64,
            "turns": 6,
            "first_turn_len": 4000,
            "turn_len": 500,
            "output_len": 256,
            "think_time_s": 5.0,
            "arrival": "poisson:2",
        },
    ),
}
POLICIES = ["fcfs", "lpm", "dfs-weight", "grouped", "feather-paper", "feather-upstream"]
POLICIES += ["feather-ppo", "feather"]
HARDWARE = "h200"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policies")
    args = p.parse_args()
    policies = args.policies.split(",")
    rows = []
    for name, (base, fields) in SHAPES.items():
        for seed in (0, 1, 2):
            workload = make_workload(base, **fields)
            for policy in policies:
                s = simulate(workload, policy, hardware=HARDWARE, seed=seed).summary()
                rows.append({"workload": name, "seed": seed, **s})
                print(name, seed, policy, round(s["output_tok_s"]), flush=True)
    config = {"hardware": HARDWARE, "provenance": "measured", "shapes": SHAPES}
    config["policies"] = policies
    write_record(args.out, config=config, rows=rows)


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
