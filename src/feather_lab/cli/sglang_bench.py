"""`feather sglang-bench`: one scheduling pass's CPU in SGLang's own classes.

Its options are the harness's own (`harness.sglang_bench.main` parses them), so the command
passes its arguments on untouched.
"""

from __future__ import annotations

import importlib.util

import typer

from feather_lab.cli.common import app, fail


@app.command(
    "sglang-bench",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def sglang_bench_cmd(ctx: typer.Context) -> None:
    """CPU cost of one scheduling pass in SGLang's own classes: lpm / dfs-weight vs Feather.

    Needs the 'sglang' extra. Options: --sizes 128,1000,10000 --repeats 5 --passes 32
    --running 0 --max-running 1024 --policy NAME --seed 0 --json FILE (--help for the
    list)."""
    if importlib.util.find_spec("sglang") is None:
        from feather_lab.harness.sglang_suite import SGLANG_INSTALL

        fail(RuntimeError(f"sglang-bench needs SGLang, not installed here: {SGLANG_INSTALL}"))
    from feather_lab.harness.sglang_bench import main as sglang_bench_main

    raise typer.Exit(sglang_bench_main(list(ctx.args)))
