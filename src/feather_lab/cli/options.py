"""Every option the commands take, declared once: its flag, type, bounds and help.

A setting several commands take (`--arrival`, `--limit`, the SLOs, `--seed`, ...) has one
declaration here, so it reads the same, with one unit, in each command's `--help`; a
command's module holds its logic only. Names are the option's own, prefixed by the
command where two commands give one flag different meanings (`--model`: a profile to the
simulator, a served model to `feather replay`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from feather_lab.bench.suite import DEFAULT_POLICIES

Command = TypeVar("Command", bound=Callable[..., Any])


def _option(kind: Any, help: str, *flags: str, **settings: Any) -> Any:
    """An option's annotation: its value type, help, flags (where not the parameter's own
    name) and settings such as bounds, read by typer as `Annotated[kind, Option(...)]`."""
    return Annotated[kind, typer.Option(*flags, help=help, **settings)]


# ---- shared by several commands

Hardware = _option(
    str,
    "Hardware profile name or JSON file (`feather list hardware` says where each "
    "comes from: measured, derived or estimate).",
)
Kernel = _option(str, "Attention kernel: paged or ideal.")
Seed = _option(int, "Workload seed.", min=0)
DropOverlong = _option(
    bool,
    "Drop requests longer than the model's context (prompt + output), counted in "
    "the row as dropped_overlong; without it such a workload is an error.",
    "--drop-overlong",
)
Arrival = _option(
    str | None,
    "Arrival process of generated workloads: all, poisson:RATE (requests/s) or "
    "bursts:SIZE:INTERVAL. Default: each workload's own (all at once). Not for traces.",
)
RateScale = _option(
    float | None,
    "Multiply the request rate (arrival times divided by it), e.g. 10 replays a trace 10x faster.",
)
Limit = _option(int | None, "Keep each workload's first N requests (by arrival).", min=1)
SloTtft = _option(
    float | None, "SLO on time to first token, seconds (goodput counts requests within)."
)
SloTpot = _option(
    float | None, "SLO on time per output token, seconds (goodput counts requests within)."
)
Rates = _option(
    str | None,
    "Latency-throughput sweep: comma-separated request rates (req/s); each workload "
    "runs at each (Poisson arrivals; a trace rescaled to that mean rate), plotted.",
)
JsonOut = _option(Path, "JSON results.", "--json")

SCHEDULE: dict[str, tuple[Any, Any]] = {
    "seed": (Seed, 0),
    "drop_overlong": (DropOverlong, False),
    "arrival": (Arrival, None),
    "rate_scale": (RateScale, None),
    "rates": (Rates, None),
    "limit": (Limit, None),
    "slo_ttft": (SloTtft, None),
    "slo_tpot": (SloTpot, None),
}
"""A workload's seed, schedule and SLO, taken the same way by every command that builds
workloads (`feather bench`, `feather replay`): name -> (annotation, default)."""


def with_options(*tables: dict[str, tuple[Any, Any]]) -> Callable[[Command], Command]:
    """`command(..., **rest)` shown to typer with the options of `tables` after its own, so an
    option shared by commands is declared, with its default, in one place."""

    def wrap(command: Command) -> Command:
        own = inspect.signature(command, eval_str=True)
        params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
        keyword = inspect.Parameter.KEYWORD_ONLY
        params += [
            inspect.Parameter(name, keyword, annotation=kind, default=default)
            for table in tables
            for name, (kind, default) in table.items()
        ]
        command.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        return command

    return wrap


def options_of(own: dict[str, Any], rest: dict[str, Any]) -> dict[str, Any]:
    """Every option of a `with_options` command by name: its own locals and its `**rest`."""
    return {k: v for k, v in own.items() if k != "rest"} | rest


# ---- `feather bench`

BenchJsonOut = _option(
    Path,
    "JSON record of the run. An existing file is replaced, and stderr says so ('replacing FILE').",
    "--json",
)
BenchPlot = _option(
    Path | None,
    "Plot: .png, .pdf, .svg or .jpg. Default: the --json name with .png "
    "(--json h200.json: h200.png). An existing file is replaced, and stderr says so.",
    "--plot",
)
BenchEngine = _option(
    str,
    "sim: the simulator; vllm: the real vLLM engine (needs the 'vllm' extra); "
    "sglang: SGLang's real scheduler loop with a stand-in forward (the 'sglang' extra).",
)
BenchWorkloads = _option(
    list[str],
    "Workload name or trace:PATH; repeat or comma-separate. Default: the built-in suite.",
    "--workload",
    "-w",
)
BenchPolicies = _option(
    str | None,
    "Comma-separated policies to compare. Default: "
    + ",".join(DEFAULT_POLICIES)
    + " (sim); grouped, feather, feather-paper and feather-upstream against vLLM's own "
    "scheduler (--engine vllm); SGLang's own fcfs, lpm, dfs-weight beside Feather's "
    "(--engine sglang; default fcfs,lpm,feather,feather-paper,feather-upstream).",
)
BenchModel = _option(
    str | None,
    "Model profile name or JSON file (sim; default llama-3.1-8b). --engine vllm: a "
    "random-weight Llama built locally, tiny-llama (default) or kv-bound (KV-read-bound "
    "decode, its own workloads: paper-32g, paper-4g, no-sharing), or a model directory.",
)
BenchMaxNumSeqs = _option(
    int | None, "Engine max running sequences (default 256; 500 for paper-*).", min=1
)
MaxBatchedTokens = _option(int, "Engine token budget per step.", min=1)
KvBlocks = _option(
    int | None,
    "KV cache blocks (sim default: sized from the hardware memory; --engine vllm "
    "default: two runs, under KV pressure and without).",
    min=1,
)
PolicyState = _option(
    Path | None,
    "Feather bandit table: loaded if the file exists (warm start), saved after the "
    "run (--engine vllm: after each feather run, so later repeats start warm).",
    "--policy-state",
)
BenchFeatherHardware = _option(
    str | None,
    "Hardware profile (name or JSON) the feather policy takes as its step-cost prior. "
    "Sim: default the bench's own --hardware, 'none' for no prior. --engine vllm: default "
    "none; pass the profile `feather calibrate` fitted for this machine.",
)
BenchRepeats = _option(int, "Runs per configuration (--engine vllm).", min=1)
AsyncScheduling = _option(
    bool,
    "--engine vllm: run vLLM's async scheduling (the GPU default), also on CPU.",
    "--async-scheduling",
)
BenchReplicas = _option(
    int | None, "Simulate a cluster of N replicas behind each of --routers (bench.cluster).", min=1
)
BenchRouters = _option(
    str | None,
    "With --replicas: comma-separated routers (pow2, prefix-affinity, feather), "
    "each over its replica policy (fcfs, fcfs, feather) or over each of --policies; an "
    "entry may name its pair (router/policy). Default: those three pairs, "
    "prefix-affinity/feather and feather/fcfs.",
)
SchedulerSeesOutput = _option(
    str | None,
    "What the scheduler knows of each output: cap (default: the client's max_tokens, "
    "the true length only under ignore_eos, as a real engine) or exact (every request's "
    "true length).",
    "--scheduler-sees-output",
)
SchedulerCpu = _option(
    str | None,
    "The scheduler's CPU on the simulated clock: model (default: per-policy costs "
    "fitted from SGLang's own code), measured (the policy's Python as timed here) or off; "
    "hidden under the GPU step up to its length (async scheduling / overlap loop).",
    "--scheduler-cpu",
)
StepsOut = _option(
    Path | None,
    "Write the step log (JSONL): one line per step with batch, prefix groups, "
    "admitted ids and every ADD/STOP with its features.",
)

# ---- `feather replay`

ReplayUrls = Annotated[
    list[str],
    typer.Argument(
        help="Server base URLs (http://host:port): vLLM's or SGLang's OpenAI-compatible API. "
        "Several: the same schedule against each, interleaved (an A/B; the first is A)."
    ),
]
ReplayWorkloads = _option(
    list[str],
    "Workload name or trace:PATH; repeat or comma-separate (`feather list workloads`). "
    "Default with --model: that model's engine workloads; else required.",
    "--workload",
    "-w",
)
ReplayLabels = _option(
    str | None, "Comma-separated names of the servers, one per URL (default A, B, ...)."
)
ReplayModel = _option(
    str | None,
    "The servers run a built-in engine model (tiny-llama or kv-bound, the directory "
    "`harness.tiny_llama` builds): its engine-sized workloads (paper-32g, ...) and "
    "vocabulary. Default: the simulator suite's workloads.",
)
VocabSize = _option(
    int | None, "Token ids of generated workloads < this (the server's vocab).", min=1
)
MaxConcurrency = _option(
    int | None, "At most this many requests in flight (default: no cap).", min=1
)
RequestTimeout = _option(
    float, "A request fails when the server sends nothing for this many seconds."
)
Scenario = _option(
    str | None,
    "A name for the servers' setup (e.g. kv-pressure), appended to each workload's "
    "name as the in-process bench does: 'paper-32g (kv-pressure)'.",
)

StreamInterval = _option(
    int,
    "Ask for every N tokens in one streamed chunk (vLLM's per-request "
    "stream_interval, as `vllm serve --stream-interval`): less API-server and client "
    "work per token. TTFT and TPOT keep their meaning; ITL is then per chunk. "
    "1: a chunk per token, nothing extra sent.",
    min=1,
)
ReplayApi = _option(
    str,
    "completions: the OpenAI /v1/completions (vLLM, SGLang); generate: SGLang's "
    "native /generate (input_ids, sampling_params).",
)

# ---- `feather vllm-bench`

PassSizes = _option(str, "Waiting-queue lengths, held for each run.")
PassRepeats = _option(int, "Interleaved runs per size.", min=1)
PassSteps = _option(int, "Timed engine steps per run.", min=1)
PassWarmup = _option(int, "Engine steps before timing.", min=0)
PassPolicy = _option(str, "Feather's policy (FEATHER_POLICY).")
PassKvBlocks = _option(int, "KV blocks of 32 tokens.", min=1)
PassMaxNumSeqs = _option(int, "vLLM's running requests at most.", min=1)
OptionalJsonOut = _option(Path | None, "Write the record to this JSON file.", "--json")
PassProfile = _option(
    Path | None, "Then one cProfile'd Feather run per size, written to this folder."
)

# ---- `feather calibrate`

CalibrateModel = _option(
    str | None,
    "tiny-llama (default) or kv-bound (random-weight Llamas built locally), or a "
    "Hugging Face model directory.",
)
ModelProfile = _option(
    str | None, "Model profile (name or JSON) of a --model directory, for the cost model."
)
BaseHardware = _option(str, "Hardware profile whose peak figures the fit starts from.")
BenchJsonIn = _option(
    Path | None, "Real-engine rows from `feather bench --engine vllm --json` to compare with."
)
GridPasses = _option(int, "Passes over the grid; each sample is the median over passes.", min=1)
CalibrateFeatherHardware = _option(
    str | None,
    "A fitted hardware profile the compared feather policy takes as its step-cost "
    "prior (e.g. an earlier calibration's --out).",
)

# ---- `feather train`

TrainWorkloads = _option(
    list[str],
    "Workload name to train on (repeat or comma-separate; 'mix' = the built-in mix). "
    "Default: the built-in mix (paper long-prefix scenarios, shared-prefix, document-qa).",
    "--workload",
    "-w",
)
TrainMaxNumSeqs = _option(
    int | None,
    "Engine max running sequences (default: the bench suite's setting for the "
    "workload, e.g. 500 for paper-*; else 256).",
    min=1,
)
