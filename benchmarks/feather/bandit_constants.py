"""How much Feather's results depend on its constants: the measurement behind each default.

Runs `feather` (with the bench's own step-cost prior, as `feather bench` does) on the default
simulator suite with one constant at a time moved to half and to double its default, and
reports each variant's output tokens/s over the default's on every workload, and the worst
and best workload. The simulator is deterministic, so one run per cell is the result.
`--no-prior` runs feather without its step-cost prior (`feather bench --feather-hardware
none`), where only the bandit's data decides.
Usage: python benchmarks/feather/bandit_constants.py [--hardware h100] [--no-prior] [--json FILE]
       [--constants NAME,NAME]  (only those constants; default: every one)
"""

from __future__ import annotations

import argparse

from feather_lab.bench.record import write_record
from feather_lab.bench.suite import BenchSpec, build_workload
from feather_lab.sim.engine import simulate
from feather_sched.cost import StepCostModel
from feather_sched.policies.feather import FeatherPolicy

VARIANTS: dict[str, tuple[float, float]] = {
    "alpha": (0.05, 0.2),
    "confidence": (0.5, 2.0),
    "initial_budget": (0.5, 2.0),
    "horizon": (2, 8),
    "prior_error": (0.025, 0.1),
    "starvation_share": (0.125, 0.5),
    "stop_delay_share": (0.1, 0.4),
}
"""FeatherPolicy options and the two values tried for each (half and double the default)."""


def throughput(spec: BenchSpec, workload: str, cost: StepCostModel, **options) -> float:
    requests = build_workload(workload).generate(spec.seed)
    policy = FeatherPolicy(cost=spec.feather_cost(), **options)
    return simulate(requests, policy, cost, spec.engine_for(workload)).output_tok_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hardware", default="h100")
    parser.add_argument("--no-prior", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--constants", default=",".join(VARIANTS), help="which to vary")
    args = parser.parse_args()
    names = [n for n in args.constants.split(",") if n]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown or not names:
        parser.error(f"--constants: unknown {unknown or args.constants!r}; valid: {list(VARIANTS)}")
    spec = BenchSpec(hardware=args.hardware, feather_hardware="none" if args.no_prior else None)
    cost = StepCostModel(spec.hardware, spec.model, spec.kernel)
    base = {w: throughput(spec, w, cost) for w in spec.workloads}
    print({"variant": "default", **{w: round(v, 1) for w, v in base.items()}}, flush=True)
    rows = []
    for name in names:
        for value in VARIANTS[name]:
            ratio = {w: throughput(spec, w, cost, **{name: value}) / base[w] for w in base}
            row = {
                "constant": name,
                "value": value,
                "worst": round(min(ratio.values()), 3),
                "best": round(max(ratio.values()), 3),
                "by_workload": {w: round(r, 3) for w, r in ratio.items()},
            }
            rows.append(row)
            print(row, flush=True)
    if args.json:
        write_record(
            args.json,
            rows=rows,
            default_tok_s=base,
            hardware=spec.hardware,
            model=spec.model,
            prior=not args.no_prior,
        )


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
