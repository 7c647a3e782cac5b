"""The `feather` command."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Feather: prefix-homogeneity-aware scheduling for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _main() -> None:
    """Feather: prefix-homogeneity-aware scheduling for LLM serving."""


if __name__ == "__main__":
    app()
