"""The `feather` console script: says which extra to install when the lab's libraries are
missing, instead of a traceback."""

from __future__ import annotations

import sys

_LAB_LIBRARIES = ("typer", "rich", "matplotlib", "httpx")


def main() -> None:
    try:
        from feather_lab.cli import app
    except ModuleNotFoundError as exc:
        if exc.name not in _LAB_LIBRARIES:
            raise
        print(
            f"feather: the command needs {exc.name!r}, which comes with the bench extra:\n"
            "  pip install 'feather-sched[bench]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    from feather_lab.bench.record import take_allow_flag

    take_allow_flag(sys.argv)
    app()
