"""Every option the commands take, declared once: its flag, type, bounds and help.

A setting several commands take (`--arrival`, `--limit`, the SLOs, `--seed`, ...) has one
declaration here, so it reads the same, with one unit, in each command's `--help`; a
command's module holds its logic only. Names are the option's own, prefixed by the
command where two commands give one flag different meanings (`--model`: a profile to the
simulator, a served model to `feather replay`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from feather_lab.bench.suite import DEFAULT_POLICIES

# ---- shared by several commands

Hardware = Annotated[
    str,
    typer.Option(
        help="Hardware profile name or JSON file (`feather list hardware` says where each "
        "comes from: measured, derived or estimate)."
    ),
]
Kernel = Annotated[str, typer.Option(help="Attention kernel: paged or ideal.")]
Seed = Annotated[int, typer.Option(min=0, help="Workload seed.")]
DropOverlong = Annotated[
    bool,
    typer.Option(
        "--drop-overlong",
        help="Drop requests longer than the model's context (prompt + output), counted in "
        "the row as dropped_overlong; without it such a workload is an error.",
    ),
]
Arrival = Annotated[
    str | None,
    typer.Option(
        help="Arrival process of generated workloads: all, poisson:RATE (requests/s) or "
        "bursts:SIZE:INTERVAL. Default: each workload's own (all at once). Not for traces.",
    ),
]
RateScale = Annotated[
    float | None,
    typer.Option(
        help="Multiply the request rate (arrival times divided by it), e.g. 10 replays a "
        "trace 10x faster.",
    ),
]
Limit = Annotated[
    int | None,
    typer.Option(min=1, help="Keep each workload's first N requests (by arrival)."),
]
SloTtft = Annotated[
    float | None,
    typer.Option(help="SLO on time to first token, seconds (goodput counts requests within)."),
]
SloTpot = Annotated[
    float | None,
    typer.Option(help="SLO on time per output token, seconds (goodput counts requests within)."),
]
Rates = Annotated[
    str | None,
    typer.Option(
        help="Latency-throughput sweep: comma-separated request rates (req/s); each workload "
        "runs at each (Poisson arrivals; a trace rescaled to that mean rate), plotted.",
    ),
]
JsonOut = Annotated[Path, typer.Option("--json", help="JSON results.")]


# ---- `feather bench`

BenchJsonOut = Annotated[
    Path,
    typer.Option(
        "--json",
        help="JSON record of the run. An existing file is replaced, and stderr says so "
        "('replacing FILE').",
    ),
]
BenchPlot = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        help="Plot: .png, .pdf, .svg or .jpg. Default: the --json name with .png "
        "(--json h200.json: h200.png). An existing file is replaced, and stderr says so.",
    ),
]
BenchEngine = Annotated[
    str,
    typer.Option(
        help="sim: the simulator; vllm: the real vLLM engine (needs the 'vllm' extra); "
        "sglang: SGLang's real scheduler loop with a stand-in forward (the 'sglang' extra)."
    ),
]
BenchWorkloads = Annotated[
    list[str],
    typer.Option(
        "--workload",
        "-w",
        help="Workload name or trace:PATH; repeat or comma-separate. Default: the built-in suite.",
    ),
]
BenchPolicies = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated policies to compare. Default: "
        + ",".join(DEFAULT_POLICIES)
        + " (sim); grouped, feather, feather-paper and feather-upstream against vLLM's own "
        "scheduler (--engine vllm); SGLang's own fcfs, lpm, dfs-weight beside Feather's "
        "(--engine sglang; default fcfs,lpm,feather,feather-paper,feather-upstream).",
    ),
]
BenchModel = Annotated[
    str | None,
    typer.Option(
        help="Model profile name or JSON file (sim; default llama-3.1-8b). --engine vllm: a "
        "random-weight Llama built locally, tiny-llama (default) or kv-bound (KV-read-bound "
        "decode, its own workloads: paper-32g, paper-4g, no-sharing), or a model directory.",
    ),
]
BenchMaxNumSeqs = Annotated[
    int | None,
    typer.Option(min=1, help="Engine max running sequences (default 256; 500 for paper-*)."),
]
MaxBatchedTokens = Annotated[int, typer.Option(min=1, help="Engine token budget per step.")]
KvBlocks = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="KV cache blocks (sim default: sized from the hardware memory; --engine vllm "
        "default: two runs, under KV pressure and without).",
    ),
]
PolicyState = Annotated[
    Path | None,
    typer.Option(
        "--policy-state",
        help="Feather bandit table: loaded if the file exists (warm start), saved after the "
        "run (--engine vllm: after each feather run, so later repeats start warm).",
    ),
]
BenchFeatherHardware = Annotated[
    str | None,
    typer.Option(
        help="Hardware profile (name or JSON) the feather policy takes as its step-cost prior. "
        "Sim: default the bench's own --hardware, 'none' for no prior. --engine vllm: default "
        "none; pass the profile `feather calibrate` fitted for this machine.",
    ),
]
BenchRepeats = Annotated[int, typer.Option(min=1, help="Runs per configuration (--engine vllm).")]
AsyncScheduling = Annotated[
    bool,
    typer.Option(
        "--async-scheduling",
        help="--engine vllm: run vLLM's async scheduling (the GPU default), also on CPU.",
    ),
]
BenchReplicas = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Simulate a cluster of N replicas behind each of --routers (bench.cluster).",
    ),
]
BenchRouters = Annotated[
    str | None,
    typer.Option(
        help="With --replicas: comma-separated routers (pow2, prefix-affinity, feather), "
        "each over its replica policy (fcfs, fcfs, feather) or over each of --policies; an "
        "entry may name its pair (router/policy). Default: those three pairs, "
        "prefix-affinity/feather and feather/fcfs.",
    ),
]
SchedulerSeesOutput = Annotated[
    str | None,
    typer.Option(
        "--scheduler-sees-output",
        help="What the scheduler knows of each output: cap (default: the client's max_tokens, "
        "the true length only under ignore_eos, as a real engine) or exact (every request's "
        "true length).",
    ),
]
SchedulerCpu = Annotated[
    str | None,
    typer.Option(
        "--scheduler-cpu",
        help="The scheduler's CPU on the simulated clock: model (default: per-policy costs "
        "fitted from SGLang's own code), measured (the policy's Python as timed here) or off; "
        "hidden under the GPU step up to its length (async scheduling / overlap loop).",
    ),
]
StepsOut = Annotated[
    Path | None,
    typer.Option(
        help="Write the step log (JSONL): one line per step with batch, prefix groups, "
        "admitted ids and every ADD/STOP with its features.",
    ),
]

# ---- `feather replay`

ReplayUrls = Annotated[
    list[str],
    typer.Argument(
        help="Server base URLs (http://host:port): vLLM's or SGLang's OpenAI-compatible API. "
        "Several: the same schedule against each, interleaved (an A/B; the first is A)."
    ),
]
ReplayWorkloads = Annotated[
    list[str],
    typer.Option(
        "--workload",
        "-w",
        help="Workload name or trace:PATH; repeat or comma-separate (`feather list workloads`). "
        "Default with --model: that model's engine workloads; else required.",
    ),
]
ReplayLabels = Annotated[
    str | None,
    typer.Option(help="Comma-separated names of the servers, one per URL (default A, B, ...)."),
]
ReplayModel = Annotated[
    str | None,
    typer.Option(
        help="The servers run a built-in engine model (tiny-llama or kv-bound, the directory "
        "`harness.tiny_llama` builds): its engine-sized workloads (paper-32g, ...) and "
        "vocabulary. Default: the simulator suite's workloads.",
    ),
]
VocabSize = Annotated[
    int | None,
    typer.Option(min=1, help="Token ids of generated workloads < this (the server's vocab)."),
]
MaxConcurrency = Annotated[
    int | None, typer.Option(min=1, help="At most this many requests in flight (default: no cap).")
]
RequestTimeout = Annotated[
    float,
    typer.Option(help="A request fails when the server sends nothing for this many seconds."),
]
Scenario = Annotated[
    str | None,
    typer.Option(
        help="A name for the servers' setup (e.g. kv-pressure), appended to each workload's "
        "name as the in-process bench does: 'paper-32g (kv-pressure)'.",
    ),
]

StreamInterval = Annotated[
    int,
    typer.Option(
        min=1,
        help="Ask for every N tokens in one streamed chunk (vLLM's per-request "
        "stream_interval, as `vllm serve --stream-interval`): less API-server and client "
        "work per token. TTFT and TPOT keep their meaning; ITL is then per chunk. "
        "1: a chunk per token, nothing extra sent.",
    ),
]
ReplayApi = Annotated[
    str,
    typer.Option(
        help="completions: the OpenAI /v1/completions (vLLM, SGLang); generate: SGLang's "
        "native /generate (input_ids, sampling_params).",
    ),
]

# ---- `feather vllm-bench`

PassSizes = Annotated[str, typer.Option(help="Waiting-queue lengths, held for each run.")]
PassRepeats = Annotated[int, typer.Option(min=1, help="Interleaved runs per size.")]
PassSteps = Annotated[int, typer.Option(min=1, help="Timed engine steps per run.")]
PassWarmup = Annotated[int, typer.Option(min=0, help="Engine steps before timing.")]
PassPolicy = Annotated[str, typer.Option(help="Feather's policy (FEATHER_POLICY).")]
PassKvBlocks = Annotated[int, typer.Option(min=1, help="KV blocks of 32 tokens.")]
PassMaxNumSeqs = Annotated[int, typer.Option(min=1, help="vLLM's running requests at most.")]
OptionalJsonOut = Annotated[
    Path | None, typer.Option("--json", help="Write the record to this JSON file.")
]
PassProfile = Annotated[
    Path | None,
    typer.Option(help="Then one cProfile'd Feather run per size, written to this folder."),
]

# ---- `feather calibrate`

CalibrateModel = Annotated[
    str | None,
    typer.Option(
        help="tiny-llama (default) or kv-bound (random-weight Llamas built locally), or a "
        "Hugging Face model directory.",
    ),
]
ModelProfile = Annotated[
    str | None,
    typer.Option(help="Model profile (name or JSON) of a --model directory, for the cost model."),
]
BaseHardware = Annotated[
    str, typer.Option(help="Hardware profile whose peak figures the fit starts from.")
]
BenchJsonIn = Annotated[
    Path | None,
    typer.Option(
        help="Real-engine rows from `feather bench --engine vllm --json` to compare with."
    ),
]
GridPasses = Annotated[
    int,
    typer.Option(min=1, help="Passes over the grid; each sample is the median over passes."),
]
CalibrateFeatherHardware = Annotated[
    str | None,
    typer.Option(
        help="A fitted hardware profile the compared feather policy takes as its step-cost "
        "prior (e.g. an earlier calibration's --out).",
    ),
]

# ---- `feather train`

TrainWorkloads = Annotated[
    list[str],
    typer.Option(
        "--workload",
        "-w",
        help="Workload name to train on (repeat or comma-separate; 'mix' = the built-in mix). "
        "Default: the built-in mix (paper long-prefix scenarios, shared-prefix, document-qa).",
    ),
]
TrainMaxNumSeqs = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Engine max running sequences (default: the bench suite's setting for the "
        "workload, e.g. 500 for paper-*; else 256).",
    ),
]
