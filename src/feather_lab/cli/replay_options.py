"""`feather replay`'s options that `vllm bench serve` has too, under its names and meaning
(vllm/benchmarks/serve.py and datasets/datasets.py in vLLM 0.32), and the dataset they make."""

from __future__ import annotations

import math
from typing import Annotated, Any

import typer

VLLM = "vllm bench serve's options"


def _vllm(kind: Any, default: Any, help_text: str, **settings: Any) -> tuple[Any, Any]:
    """One of vLLM's options: its annotation (in vLLM's help panel) and its default."""
    return Annotated[kind, typer.Option(help=help_text, rich_help_panel=VLLM, **settings)], default


VLLM_SERVE: dict[str, tuple[Any, Any]] = {
    "dataset_name": _vllm(
        str | None,
        None,
        "A vLLM dataset beside (or instead of) -w: random or prefix_repetition (made as "
        "`vllm bench serve --dataset-name` makes them, sent as token ids), or sharegpt "
        "(--dataset-path, sent as text).",
    ),
    "dataset_path": _vllm(
        str | None,
        None,
        "sharegpt: the JSON file (a list of {conversations: [{from, value}, ...]}).",
    ),
    "tokenizer": _vllm(
        str | None,
        None,
        "The model's tokenizer (hub name or directory, needs transformers): counts "
        "sharegpt's text prompts and gives the vocabulary of the generated datasets.",
    ),
    "sharegpt_output_len": _vllm(
        int | None, None, "sharegpt: output tokens of each request (default: its answer's).", min=1
    ),
    "num_prompts": _vllm(
        int | None,
        None,
        "Prompts of --dataset-name (default 1000); with -w alone, as --limit.",
        min=1,
    ),
    "request_rate": _vllm(
        float,
        float("inf"),
        "Requests per second (inf: all at once), for --dataset-name; a finite rate with "
        "-w alone is --rates RATE.",
    ),
    "burstiness": _vllm(
        float,
        1.0,
        "Gamma shape of the gaps between arrivals (1: Poisson; <1 burstier), with a "
        "finite --request-rate.",
    ),
    "random_input_len": _vllm(int, 1024, "random: mean input tokens.", min=0),
    "random_output_len": _vllm(int, 128, "random: mean output tokens.", min=0),
    "random_range_ratio": _vllm(
        float, 0.0, "random: lengths uniform in \\[len*(1-r), len*(1+r)], r in \\[0, 1)."
    ),
    "random_prefix_len": _vllm(
        int, 0, "random: tokens of one prefix every prompt starts with.", min=0
    ),
    "prefix_repetition_prefix_len": _vllm(int, 256, "prefix_repetition: prefix tokens.", min=0),
    "prefix_repetition_suffix_len": _vllm(
        int, 256, "prefix_repetition: suffix tokens after the prefix.", min=0
    ),
    "prefix_repetition_num_prefixes": _vllm(
        int, 10, "prefix_repetition: distinct prefixes.", min=0
    ),
    "prefix_repetition_output_len": _vllm(int, 128, "prefix_repetition: output tokens.", min=0),
    "percentile_metrics": _vllm(
        str | None,
        None,
        "Metrics whose percentiles the record's vLLM-named fields carry (ttft, tpot, "
        "itl, e2el; default ttft,tpot,itl).",
    ),
    "metric_percentiles": _vllm(str, "99", "Percentiles of those metrics, e.g. 50,99."),
}
"""`vllm bench serve`'s options as `feather replay` takes them: name -> (annotation, default)."""


DATASET_OPTION = {
    "name": "dataset_name",
    "prefix_len": "prefix_repetition_prefix_len",
    "suffix_len": "prefix_repetition_suffix_len",
    "num_prefixes": "prefix_repetition_num_prefixes",
    "prefix_output_len": "prefix_repetition_output_len",
}
"""`DatasetSpec` fields whose option (vLLM's name) says more; every other field is its option."""


def dataset_spec(opts: dict[str, Any]) -> Any:
    """The `DatasetSpec` of the options, or None without --dataset-name."""
    from dataclasses import fields

    from feather_lab.replay.datasets import DatasetSpec

    if opts["dataset_name"] is None:
        return None
    given = {f.name: opts[DATASET_OPTION.get(f.name, f.name)] for f in fields(DatasetSpec)}
    return DatasetSpec(**{**given, "num_prompts": opts["num_prompts"] or 1000})


def workload_schedule(opts: dict[str, Any]) -> dict[str, Any]:
    """--num-prompts and --request-rate applied to -w's workloads (as --limit and --rates,
    unless those are given); a ValueError where the two disagree."""
    out = dict(opts)
    if opts["num_prompts"] is not None and opts["dataset_name"] is None:
        if opts["limit"] not in (None, opts["num_prompts"]):
            raise ValueError("--num-prompts and --limit disagree: give one")
        out["limit"] = opts["num_prompts"]
    rate = opts["request_rate"]
    if not math.isinf(rate) and opts["dataset_name"] is None:
        if opts["rates"] is not None or opts["arrival"] is not None:
            raise ValueError("--request-rate with -w is --rates RATE: give one of them")
        out["rates"] = f"{rate:g}"
    if opts["burstiness"] != 1.0 and opts["dataset_name"] is None:
        raise ValueError("--burstiness applies to --dataset-name's arrivals (-w: --arrival)")
    return out


ReplayRepeats = Annotated[int, typer.Option(min=1, help="Runs per (workload, server).")]
ResetPrefixCache = Annotated[
    bool, typer.Option(help="Empty each server's prefix cache before each run, if it lets.")
]
MaxFailed = Annotated[
    float,
    typer.Option(
        min=0.0,
        max=1.0,
        help="Share of a run's requests that may fail; above it the command exits 1 "
        "(after writing the record) with the first errors.",
    ),
]
AA = Annotated[
    bool,
    typer.Option(
        "--aa",
        help="A/A: the one URL given is measured twice as two servers (A1, A2), "
        "interleaved; their B/A is the noise floor of an A/B.",
    ),
]
