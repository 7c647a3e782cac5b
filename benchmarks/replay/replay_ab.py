"""The recorded `feather replay` A/B (benchmarks/replay/README.md): two real `vllm serve`
processes on
the kv-bound model, one with vLLM's own scheduler, one with Feather's, and `feather replay`
against both, interleaved, for one KV scenario.

    python benchmarks/replay/replay_ab.py kv-pressure --json OUT.json

The servers take the in-process bench's settings (`feather bench --engine vllm --model
kv-bound`, benchmarks/vllm/kv-hold-32g.json): block 32, max_model_len 4,096, 256 sequences,
8,192 batched tokens, KV blocks by scenario (kv-pressure 1,024, no-pressure 8,192), and
Feather with the fitted CPU profile as its step-cost prior. Needs the `vllm` and `replay`
extras. Extra arguments go to `feather replay` (e.g. `--repeats 3 --limit 64`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from feather_lab.harness.tiny_llama import KV_BOUND, build_tiny_llama
from feather_lab.harness.vllm_server import ServerSpec, vllm_servers
from feather_lab.harness.vllm_spec import ENGINE_SCALES

HERE = Path(__file__).resolve().parent
PRIOR = HERE.parent / "vllm" / "cpu-kv-bound-fitted.json"


MODEL_IN_CORE_HELP = (
    "Run each server's model in its engine core's process (--distributed-executor-backend uni, "
    "VLLM_ENABLE_V1_MULTIPROCESSING=0), as the in-process bench does, instead of the CPU "
    "platform's separate worker process."
)

SCENARIOS = {s.name: s.num_blocks for s in ENGINE_SCALES["kv-bound"].scenarios}
"""KV scenario -> the servers' KV blocks (the in-process bench's `--num-kv-blocks`)."""


def server_specs(scenario: str, cache: Path, model_in_core: bool = False) -> list[ServerSpec]:
    """vLLM's own scheduler and Feather's, on the kv-bound model built under `cache`, with
    the in-process bench's settings for `scenario`; `model_in_core`: the model in the engine
    core's process, as in the bench (`ServerSpec.model_in_core`)."""
    model = str(build_tiny_llama(cache / "kv-bound", KV_BOUND))
    shared = dict(
        max_model_len=ENGINE_SCALES["kv-bound"].max_model_len,
        num_gpu_blocks=SCENARIOS[scenario],
        max_num_batched_tokens=8192,
        model_in_core=model_in_core,
    )
    options = json.dumps({"hardware": str(PRIOR), "model": "kv-bound"})
    return [
        ServerSpec(model, **shared),
        ServerSpec(
            model,
            feather=True,
            env=(("FEATHER_POLICY", "feather"), ("FEATHER_POLICY_OPTIONS", options)),
            **shared,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "feather")
    parser.add_argument("--model-in-core", action="store_true", help=MODEL_IN_CORE_HELP)
    args, replay_args = parser.parse_known_args(argv)
    specs = server_specs(args.scenario, args.cache, args.model_in_core)
    with tempfile.TemporaryDirectory() as logs, vllm_servers(specs, Path(logs)) as urls:
        cmd = [sys.executable, "-m", "feather_lab.cli", "replay", *urls]
        cmd += ["--label", "vllm,feather", "--model", "kv-bound", "--scenario", args.scenario]
        cmd += ["--json", str(args.json), *replay_args]
        print(" ".join(cmd[2:]), flush=True)
        return subprocess.call(cmd)


if __name__ == "__main__":
    raise SystemExit(main())
