"""`python -m feather_lab.probe`: `feather probe` without typer/rich (argparse only), for a
lent GPU machine that has torch, triton and numpy but not this package's CLI dependencies."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from feather_lab.probe.run import run_probe
from feather_lab.probe.spec import ProbeSpec
from feather_lab.probe.summary import summary_lines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m feather_lab.probe", description=__doc__)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="the small grid")
    p.add_argument("--model", default=None, help="model profile (default: by device)")
    p.add_argument("--base-hardware", default=None, help="peak figures (default: by device)")
    p.add_argument("--dtype", default=None)
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1)")
    p.add_argument("--grid", default=None, help="a grid by name (layout.GRIDS)")
    p.add_argument(
        "--kernel",
        action="append",
        dest="kernels",
        default=None,
        help="attention kernel(s) to time, first one fitted (torch-ref, triton-paged, flashinfer)",
    )
    p.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false")
    p.add_argument("--budget-s", type=float, default=None)
    p.add_argument("--out", type=Path, default=Path("feather-probe-profile.json"))
    p.add_argument("--json", dest="json_out", type=Path, default=Path("feather-probe.json"))
    p.add_argument("--plot", type=Path, default=Path("feather-probe.png"))
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    # every option but the output paths is a ProbeSpec field of the same name
    names = {f.name for f in fields(ProbeSpec)}
    spec = ProbeSpec(**{k: v for k, v in vars(a).items() if k in names})
    report = run_probe(spec, a.out, a.json_out, a.plot, log=lambda s: print(s, flush=True))
    for line in summary_lines(report):
        print(line)
    print(f"wrote {a.out}, {a.json_out}" + (f", {report['plot']}" if report.get("plot") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
