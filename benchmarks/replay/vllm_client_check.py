"""`feather replay` against vLLM's own client (`vllm bench serve`, vllm.benchmarks.serve) on
one server: the tiny random-weight Llama on vLLM's CPU backend, the same `random` dataset
parameters, the two clients interleaved (their order alternating), the server's prefix cache
emptied before every run, after one warm-up run of each (a fresh server's first requests
pay one-time costs). Records each run's fields under vLLM's names, each client process's CPU
seconds (imports included) and replay's own CPU over its run, the medians side by side with
their ratio, each client's run-to-run spread, and whether the two agree within 15% and
within the spread.

Run in the vLLM environment, from the repository root (FEATHER_PORT_RANGE=LOW-HIGH keeps the
server on ports of your own):
    PYTHONPATH=src python benchmarks/replay/vllm_client_check.py --repeats 3 \
        --json benchmarks/replay/vllm-client-check.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from feather_lab.bench.record import write_record
from feather_lab.harness.tiny_llama import build_tiny_llama
from feather_lab.harness.vllm_server import ServerSpec, served
from feather_lab.replay.summary import within_noise

FIELDS = ("output_throughput", "request_throughput", "mean_ttft_ms", "median_ttft_ms",
          "p99_ttft_ms", "mean_tpot_ms", "client_process_cpu_s", "completed", "failed",
          "client_cpu_s")  # fmt: skip
AGREE = 0.15


def dataset_args(a: argparse.Namespace, seed: int) -> list[str]:
    """The same options, by the same names, for both clients."""
    out = ["--dataset-name", "random", "--num-prompts", str(a.num_prompts)]
    out += ["--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len)]
    out += ["--request-rate", "inf", "--seed", str(seed)]
    return [*out, "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]


def run_replay(url: str, model: str, a: argparse.Namespace, seed: int, out: Path) -> dict:
    """Replay's run; its prompts as text through the model's tokenizer, as vLLM's client
    sends them."""
    cmd = [sys.executable, "-m", "feather_lab.cli", "replay", url, *dataset_args(a, seed)]
    cmd += ["--tokenizer", model, "--json", str(out)]
    cpu = _child_cpu(cmd)
    return {**json.loads(out.read_text())["rows"][0], "client_process_cpu_s": cpu}


def run_vllm_client(url: str, model: str, a: argparse.Namespace, seed: int, out: Path) -> dict:
    httpx.post(url + "/reset_prefix_cache", timeout=30).raise_for_status()  # as replay does
    code = (
        "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
        "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
        "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
    )
    cmd = [sys.executable, "-c", code, "--backend", "vllm", "--base-url", url, "--model", model]
    cmd += ["--tokenizer", model, *dataset_args(a, seed), "--ignore-eos", "--disable-tqdm"]
    cmd += ["--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    cpu = _child_cpu(cmd)
    return {**json.loads(out.read_text()), "client_process_cpu_s": cpu}


def seed_of(rep: int) -> int:
    """Recorded run `rep` (0..) uses seed rep + 1; warm-up -k uses 100 + k."""
    return rep + 1 if rep >= 0 else 100 - rep


def _child_cpu(cmd: list[str]) -> float:
    """Run the client; its process's CPU seconds (user + system, imports included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmups", type=int, default=1, help="Unrecorded runs of each first.")
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--json", default=None)
    a = parser.parse_args()
    runs: dict[str, list[dict]] = {"feather replay": [], "vllm bench serve": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = str(build_tiny_llama(work / "tiny-llama"))
        with served([ServerSpec(model)], work) as (server,):
            for rep in range(-a.warmups, a.repeats):  # < 0: the warm-ups, not recorded
                order = list(runs) if rep % 2 == 0 else list(runs)[::-1]
                for client in order:
                    out = work / f"{client.split()[0]}-{rep}.json"
                    if client == "feather replay":
                        got = run_replay(server.url, model, a, seed_of(rep), out)
                    else:
                        got = run_vllm_client(server.url, model, a, seed_of(rep), out)
                    print(client, rep, {k: got.get(k) for k in FIELDS[:7]}, flush=True)
                    if rep >= 0:
                        runs[client].append({k: got.get(k) for k in FIELDS} | {"repeat": rep})
    report(runs, a)


def report(runs: dict[str, list[dict]], a: argparse.Namespace) -> None:
    med = {
        c: {k: statistics.median(r[k] for r in rs) for k in FIELDS[:7]} for c, rs in runs.items()
    }
    ours, theirs = med["feather replay"], med["vllm bench serve"]
    ratio = {k: ours[k] / theirs[k] for k in FIELDS[:7] if theirs[k]}
    keys = ("output_throughput", "mean_ttft_ms")
    spread = {
        c: {k: (max(r[k] for r in rs) - min(r[k] for r in rs)) / med[c][k] for k in keys}
        for c, rs in runs.items()
    }
    agree = {k: abs(ratio[k] - 1) <= AGREE for k in keys}
    # inside the run-to-run spread: the two clients' ranges of runs overlap (replay's A/B rule)
    inside = {k: within_noise(*[[r[k] for r in rs] for rs in runs.values()]) for k in keys}
    for k in FIELDS[:7]:
        print(
            f"{k:<22} replay {ours[k]:10.2f}  vllm {theirs[k]:10.2f}  ratio {ratio.get(k, 0):.3f}"
        )
    print("spread (max-min)/median:", json.dumps(spread), "agree within 15%:", agree)
    print("within the run-to-run spread:", inside)
    if a.json:
        command = ["PYTHONPATH=src python benchmarks/replay/vllm_client_check.py", *sys.argv[1:]]
        write_record(a.json, command=" ".join(command),
                     config=vars(a), runs=runs, medians=med, ratio_replay_over_vllm=ratio,
                     spread=spread, agree_within_15pct=agree, within_spread=inside)  # fmt: skip


if __name__ == "__main__":
    from feather_lab.bench.record import guard

    guard()  # a record names a commit that holds its code
    main()
