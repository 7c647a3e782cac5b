"""`feather model write`: the built-in small random-weight models, for an engine on a CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from feather_lab.cli.common import app, console, fail

model_app = typer.Typer(help="The built-in small engine models (random weights, no download).")
app.add_typer(model_app, name="model")


@model_app.command("write")
def model_write_cmd(
    name: Annotated[str, typer.Argument(help="tiny-llama or kv-bound.")],
    path: Annotated[Path, typer.Argument(help="Directory to write the model into.")],
) -> None:
    """Write a model directory any engine loads (`vllm serve DIR`, SGLang's --model-path):
    config, random weights (fixed seed) and a word-level tokenizer. Needs torch, transformers
    and tokenizers, which vLLM and SGLang install."""
    from feather_lab.harness.tiny_llama import ENGINE_MODELS, build_tiny_llama

    spec = ENGINE_MODELS.get(name)
    if spec is None:
        fail(ValueError(f"unknown model {name!r}; valid: {', '.join(ENGINE_MODELS)}"))
    if path.exists() and not path.is_dir():
        fail(ValueError(f"{path} exists and is not a directory"))
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ModuleNotFoundError as exc:
        fail(ValueError(f"writing a model needs {exc.name!r}: install vLLM or SGLang first"))
    build_tiny_llama(path, spec)
    console.print(f"wrote {name} to {path}")
