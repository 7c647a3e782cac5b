"""`feather replay URL [URL ...]`: a workload against live OpenAI-compatible servers, A/B."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import typer

from feather_lab.bench.record import write_record
from feather_lab.cli.common import (
    app,
    console,
    err_console,
    fail,
    names,
    schedule_fields,
    slo_of,
    writable,
)
from feather_lab.cli.options import (
    SCHEDULE,
    JsonOut,
    MaxConcurrency,
    ReplayApi,
    ReplayLabels,
    ReplayModel,
    ReplayUrls,
    ReplayWorkloads,
    RequestTimeout,
    Scenario,
    StreamInterval,
    VocabSize,
    options_of,
    with_options,
)
from feather_lab.cli.replay_options import (
    AA,
    VLLM_SERVE,
    MaxFailed,
    ReplayRepeats,
    ResetPrefixCache,
    dataset_spec,
    workload_schedule,
)


@app.command("replay")
@with_options(SCHEDULE, VLLM_SERVE)
def replay(
    urls: ReplayUrls,
    label: ReplayLabels = None,
    workload: ReplayWorkloads = None,
    model: ReplayModel = None,
    vocab_size: VocabSize = None,
    max_concurrency: MaxConcurrency = None,
    request_timeout: RequestTimeout = 300.0,
    repeats: ReplayRepeats = 1,
    scenario: Scenario = None,
    reset_prefix_cache: ResetPrefixCache = True,
    json_out: JsonOut = Path("feather-replay.json"),
    stream_interval: StreamInterval = 1,
    api: ReplayApi = "completions",
    max_failed: MaxFailed = 0.01,
    aa: AA = False,
    **rest: Any,
) -> None:
    """Send a workload to live servers (prompts as token ids, fixed output lengths,
    streamed, on the workload's arrival schedule); latency percentiles, throughput, goodput
    and the server's own metrics per server; with several URLs, B/A per metric."""
    opts = options_of(locals(), rest)
    _check_client(api)
    writable(json=json_out)
    if aa:
        urls, label = _aa(urls, label)
    labels = _labels(label, len(urls))
    _check_inputs(opts)
    endpoints = _preflight(urls)
    workloads = _workloads(opts, endpoints)
    _probe(endpoints, workloads, api)
    _run(opts, labels, endpoints, workloads)


def _check_inputs(opts: dict[str, Any]) -> None:
    """--model and the dataset options, before any server is asked (exit 2 naming them)."""
    from feather_lab.replay.preflight import check_model

    try:
        check_model(opts["model"])
        _check_dataset(opts)
    except ValueError as err:
        fail(err)


def _check_dataset(opts: dict[str, Any]) -> None:
    """--dataset-name's options and file checked before any server is asked (a ValueError)."""
    dataset = dataset_spec(opts)
    if dataset is None:
        if opts["dataset_path"] or opts["sharegpt_output_len"] is not None:
            raise ValueError(
                "--dataset-path and --sharegpt-output-len need --dataset-name sharegpt"
            )
        return
    dataset.validate()
    if opts["sharegpt_output_len"] is not None and dataset.name != "sharegpt":
        raise ValueError(f"--sharegpt-output-len goes with sharegpt, not {dataset.name}")
    if dataset.name == "sharegpt" and not opts["tokenizer"]:
        raise ValueError("--dataset-name sharegpt: its prompts are text: --tokenizer NAME")
    if dataset.dataset_path is not None:
        from feather_lab.replay.sharegpt import load_conversations

        load_conversations(dataset.dataset_path)


def _check_client(api: str) -> None:
    """The HTTP client installed and the API known, before anything is sent."""
    if importlib.util.find_spec("httpx") is None:
        fail(RuntimeError("feather replay needs httpx: pip install 'feather-sched[bench]'"))
    from feather_lab.replay.client import APIS

    if api not in APIS:
        fail(ValueError(f"--api {api!r}: valid: {', '.join(APIS)}"))


def _aa(urls: list[str], label: str | None) -> tuple[list[str], str]:
    """`--aa`: the one server given, measured twice as A1 and A2."""
    if len(urls) != 1:
        fail(ValueError(f"--aa measures one server twice: give one URL, not {len(urls)}"))
    return [urls[0], urls[0]], label or "A1,A2"


def _labels(text: str | None, count: int) -> tuple[str, ...]:
    if text is None and count <= 26:
        return tuple(chr(ord("A") + i) for i in range(count))
    labels = tuple(names([text or ""]))
    if len(labels) != count or len(set(labels)) != count:
        fail(ValueError(f"--label {text!r}: give {count} distinct names, one per URL"))
    return labels


def _preflight(urls: list[str]) -> list[Any]:
    """Every server checked (reachable, an OpenAI-style API, one model) before any run."""
    from feather_lab.replay.client import EndpointError, preflight

    endpoints = []
    for url in urls:
        try:
            endpoints.append(preflight(url))
        except EndpointError as err:
            fail(err)
    return endpoints


def _probe(endpoints: list[Any], workloads: list[Any], api: str) -> None:
    """Each server takes the workloads' largest token id (one request each), or exit 2."""
    from feather_lab.replay.client import EndpointError
    from feather_lab.replay.preflight import largest_token_id, probe_token_id

    top = largest_token_id(workloads)
    for endpoint in endpoints:
        try:
            probe_token_id(endpoint, top, api)
        except EndpointError as err:
            fail(err)


def _workloads(opts: dict[str, Any], endpoints: list[Any]) -> list[Any]:
    """The workloads (-w's and --dataset-name's), built and fitted to the smallest context
    the servers report, in the vocabulary of --model, --vocab-size or --tokenizer."""
    contexts = [e.max_model_len for e in endpoints if e.max_model_len]
    context = min(contexts) if contexts else None
    try:
        opts = workload_schedule(opts)
        dataset = dataset_spec(opts)
        tokenizer = _tokenizer(opts)
        chosen = names(opts["workload"]) if opts["workload"] else None
        chosen = chosen or (() if dataset else _default_workloads(opts["model"]))
        if not chosen and dataset is None:
            raise ValueError("--workload or --dataset-name: name at least one")
        out = _named_workloads(opts, chosen, context) if chosen else []
        if dataset is not None:
            out.append(_dataset_workload(opts, dataset, tokenizer, context))
        return out
    except ValueError as err:
        fail(err)


def _tokenizer(opts: dict[str, Any]) -> Any:
    """--tokenizer loaded (None without it); its vocabulary becomes --vocab-size's default."""
    if not opts["tokenizer"]:
        return None
    from feather_lab.replay.tokenizer import load_tokenizer, vocab_size

    tokenizer = load_tokenizer(opts["tokenizer"])
    if opts["vocab_size"] is None and opts["model"] is None:
        opts["vocab_size"] = vocab_size(tokenizer)
    return tokenizer


def _named_workloads(opts: dict[str, Any], chosen: Any, context: int | None) -> list[Any]:
    from feather_lab.bench.suite import BenchSpec
    from feather_lab.replay.workload import replay_workloads

    spec = BenchSpec(
        workloads=tuple(chosen),
        seed=opts["seed"],
        drop_overlong=opts["drop_overlong"],
        **schedule_fields(opts),
    )
    return replay_workloads(spec, opts["model"], opts["vocab_size"], context)


def _dataset_workload(
    opts: dict[str, Any], dataset: Any, tokenizer: Any, context: int | None
) -> Any:
    """--dataset-name's requests in the model's vocabulary, fitted to the context."""
    import dataclasses

    from feather_lab.bench.context import fit_context
    from feather_lab.harness.tiny_llama import ENGINE_MODELS
    from feather_lab.replay.datasets import dataset_workload

    model = opts["model"]
    vocab = ENGINE_MODELS[model].vocab_size if model else opts["vocab_size"]
    work = dataset_workload(dataset, vocab, tokenizer)
    kept, dropped = fit_context(
        work.requests, context or 0, opts["drop_overlong"], f"{dataset.name} on the server"
    )
    if not kept:
        raise ValueError(f"--dataset-name {dataset.name}: no request fits the server's context")
    return dataclasses.replace(work, requests=kept, dropped=dropped)


def _default_workloads(model: str | None) -> tuple[str, ...]:
    from feather_lab.harness.vllm_spec import ENGINE_SCALES

    return ENGINE_SCALES[model].default_workloads if model in ENGINE_SCALES else ()


def _run(opts: dict[str, Any], labels: tuple[str, ...], endpoints: list, workloads: list) -> None:
    """The runs, a line per run as it ends; the table, the A/B and the JSON record (also
    after Ctrl-C, with the runs that finished)."""
    from feather_lab.replay.client import ClientOptions
    from feather_lab.replay.runner import Interrupted, ReplaySpec, run_ab
    from feather_lab.replay.vllm_fields import parse_metrics, parse_percentiles

    spec = ReplaySpec(
        labels=labels,
        repeats=opts["repeats"],
        client=ClientOptions(
            opts["max_concurrency"], opts["request_timeout"], opts["stream_interval"], opts["api"]
        ),
        slo=slo_of(opts),
        reset_prefix_cache=opts["reset_prefix_cache"],
        percentile_metrics=_checked(parse_metrics, opts["percentile_metrics"]),
        metric_percentiles=_checked(parse_percentiles, opts["metric_percentiles"]),
    )
    if opts["scenario"]:
        workloads = [_tagged(w, opts["scenario"]) for w in workloads]
    try:
        runs = run_ab(endpoints, workloads, spec, on_run=_progress)
    except Interrupted as cut:
        _report(cut.runs, opts, labels, endpoints, interrupted=True)
        raise typer.Exit(130) from None
    _report(runs, opts, labels, endpoints, interrupted=False)
    _check_failures(runs, opts["max_failed"])


def _check_failures(runs: list[dict], max_failed: float) -> None:
    """Exit 1, saying which runs and their first errors, if requests failed past the share."""
    from feather_lab.replay.preflight import failed_runs

    bad = failed_runs(runs, max_failed)
    if bad:
        err_console.print(
            f"[red]error:[/red] requests failed in {len(bad)} of {len(runs)} runs (more than "
            f"--max-failed {max_failed:g} of a run's requests); its results do not stand:",
            soft_wrap=True,
        )
        for line in bad[:10]:
            err_console.print(f"  {line}", soft_wrap=True, markup=False)
        raise typer.Exit(1)


def _checked(parse: Any, text: Any) -> Any:
    try:
        return parse(text)
    except ValueError as err:
        fail(err)


def _tagged(work: Any, scenario: str) -> Any:
    import dataclasses

    params = {**work.params, "scenario": scenario}
    return dataclasses.replace(work, name=f"{work.name} ({scenario})", params=params)


def _progress(row: dict[str, Any]) -> None:
    err_console.print(
        f"{row['workload']} on {row['policy']}: {row['finished']}/{row['requests']} finished, "
        f"{row['failed']} failed, {row['output_tok_s']:,.1f} output tok/s"
        + (f" (first failure: {row['first_error']})" if row["first_error"] else ""),
        soft_wrap=True,
        markup=False,
    )


def _report(
    runs: list[dict], opts: dict[str, Any], labels: tuple, endpoints: list, interrupted: bool
) -> None:
    """The median rows' table, the A/B table and the JSON record (written first)."""
    from feather_lab.bench.machine import config_provenance
    from feather_lab.bench.output import results_text, terminal_width
    from feather_lab.replay.report import ab_text, replay_config, server_table, spread_text

    json_out: Path = opts["json_out"]
    if not runs:
        err_console.print("interrupted before any run finished; nothing written")
        return
    from feather_lab.replay.runner import summarize

    rows, ab = summarize(runs, labels)
    config = {**config_provenance(), **replay_config(opts, labels, endpoints)}
    write_record(json_out, config=config, rows=rows, ab=ab, runs=runs, interrupted=interrupted)
    title = f"feather replay: {', '.join(f'{lb} {e.url}' for lb, e in zip(labels, endpoints))}"
    print(server_table(results_text(rows, title, terminal_width())), flush=True)
    print(spread_text(rows))
    if ab:
        print(ab_text(ab, rows))
    note = " (interrupted: the runs that finished)" if interrupted else ""
    console.print(f"wrote {json_out}{note}")
