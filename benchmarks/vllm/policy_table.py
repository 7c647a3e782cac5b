"""Every policy on the real vLLM CPU engine, kv-bound model, with and without EOS: one command.

vLLM's own scheduler (FCFS) and, hosted by FeatherScheduler, `vllm-cache-aware` (vLLM 0.34's
cache-aware admission window), `feather`, `feather-hold` and the authors' `feather-paper` and
`feather-upstream`; workloads paper-32g, paper-4g and no-sharing; both KV scenarios with
`ignore_eos` (outputs run to their length), then both again ending at the model's EOS under
the same lengths as caps (harness/eos_walk.py). Medians of 3 interleaved runs. Writes the
record (after every block) and the page section (benchmarks/vllm/policy-table.md).

  python benchmarks/vllm/policy_table.py                    # the full table (hours: see page)
  python benchmarks/vllm/policy_table.py --smoke            # tiny-llama, 1 run: ~12 minutes
  python benchmarks/vllm/policy_table.py --resume           # after a stop: the blocks left
  python benchmarks/vllm/policy_table.py --page-only        # the page section from the record

Run with the vLLM venv and the source on the path (PYTHONPATH=src .venv-vllm/bin/python).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from feather_lab.bench.record import guard, write_record
from feather_lab.harness.eos_walk import RULE
from feather_lab.harness.vllm_spec import EOS_TERMINALS, VllmBenchSpec
from feather_lab.harness.vllm_table import PRIOR_POLICIES, TABLE_POLICIES, TableSpec, run_table
from feather_lab.harness.vllm_table_page import section, verdicts, write_section

HERE = Path(__file__).resolve().parent
RECORD = HERE / "policy-table.json"
PAGE = HERE / "policy-table.md"
PRIOR = "benchmarks/vllm/cpu-kv-bound-fitted.json"
SMOKE = {"model": "tiny-llama", "workloads": "shared-prefix,no-sharing", "repeats": 1}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="kv-bound")
    p.add_argument("--workloads", default="paper-32g,paper-4g,no-sharing")
    p.add_argument("--policies", default=",".join(TABLE_POLICIES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--eos-scenarios",
        default="kv-pressure,no-pressure",
        help="KV scenarios that also run ending at EOS ('' for none)",
    )
    p.add_argument(
        "--feather-hardware",
        default=PRIOR,
        help="feather and feather-hold's step-cost prior ('none')",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        help=f"the record (default {RECORD.name}; --smoke: a temp file)",
    )
    p.add_argument("--page", type=Path, default=PAGE)
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny-llama, shared-prefix and no-sharing, 1 run, where not given; no page",
    )
    p.add_argument("--page-only", action="store_true", help="rewrite the page from --json")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the blocks --json holds (same config); run the rest",
    )
    args = p.parse_args(argv)
    if args.smoke:  # its sizes, where not given
        for key, value in SMOKE.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    if args.json is None:
        smoke = Path(tempfile.gettempdir()) / "policy-table-smoke.json"
        args.json = smoke if args.smoke else RECORD
    return args


def _spec(args: argparse.Namespace) -> TableSpec:
    """The table's spec; a ValueError names a bad value."""
    names = lambda text: tuple(x for x in text.split(",") if x)  # noqa: E731
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    prior: dict = {}
    if args.feather_hardware != "none":
        if not Path(args.feather_hardware).is_file():
            raise ValueError(f"--feather-hardware {args.feather_hardware!r}: no such file")
        from feather_sched.cost.resolve import prior_cost

        prior_cost(args.feather_hardware, None, args.model)  # a bad profile fails now
        prior = {"hardware": args.feather_hardware, "model": args.model}
    policies = names(args.policies)
    bench = VllmBenchSpec(
        workloads=names(args.workloads),
        policies=policies,
        model=args.model,
        repeats=args.repeats,
        policy_options={p: prior for p in PRIOR_POLICIES if prior and p in policies},
    )
    return TableSpec(bench, names(args.eos_scenarios))


def _config(spec: TableSpec) -> dict:
    """The record's config: what ran, and the rule of the EOS model."""
    bench = spec.bench
    return {
        "engine": "vllm",
        "policies": list(bench.policies),
        "repeats": bench.repeats,
        "model": bench.model,
        "workloads": list(bench.resolved().workloads or ()),
        "eos_scenarios": list(spec.eos_scenarios),
        "policy_options": bench.policy_options,
        "eos_model": {"rule": RULE, "terminals": EOS_TERMINALS, "seed": bench.seed},
    }


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.page_only:
        if not args.json.is_file():
            print(f"error: --json {args.json}: no such record", file=sys.stderr)
            return 2
        record = json.loads(args.json.read_text())
        write_section(args.page, section({**record, "path": args.json.name}))
        print(f"wrote {args.page}")
        return 0
    try:
        spec = _spec(args)
        spec.validate()
    except (ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    config = _config(spec)

    def save(rows: list[dict], complete: bool) -> None:
        write_record(
            args.json, config=config, complete=complete, rows=rows, verdicts=verdicts(rows)
        )

    kept: list[dict] = []
    if args.resume and args.json.is_file():
        old = json.loads(args.json.read_text())
        if old.get("config") != json.loads(json.dumps(config)):
            print(f"error: --resume: {args.json} was made with another config", file=sys.stderr)
            return 2
        kept = old["rows"]
    rows = run_table(spec, save, kept=kept)
    record = json.loads(args.json.read_text())
    print(section({**record, "path": args.json.name}))
    if not args.smoke:
        write_section(args.page, section({**record, "path": args.json.name}))
    v = verdicts(rows)
    return 1 if v["outputs_differing"] else 0


if __name__ == "__main__":
    guard()
    sys.exit(main())
