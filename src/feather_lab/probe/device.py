"""The device the probe runs on: what it is, which built-in profile matches it, and how much
of the composition grid its memory holds."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from feather_lab.bench.machine import machine_info
from feather_lab.probe.spec import ProbeSpec
from feather_sched.cost import ModelProfile
from feather_sched.cost.composition import Composition


def device_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"device": device, "torch": torch.__version__}
    try:  # the version only: importing triton here would fix its interpret mode for good
        info["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        info["triton"] = None
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(
            name=p.name,
            memory_bytes=int(p.total_memory),
            l2_cache_bytes=int(getattr(p, "L2_cache_size", 0) or 0),
            sm_count=int(p.multi_processor_count),
            capability=f"{p.major}.{p.minor}",
            cuda=torch.version.cuda,
        )
    else:
        info.update(
            name=machine_info()["cpu"],
            threads=torch.get_num_threads(),
            memory_bytes=_meminfo("MemTotal"),
        )
    return info


def base_hardware_for(info: dict[str, Any]) -> str:
    """The built-in profile whose peak figures match the device (by its name)."""
    if info["device"] == "cpu":
        return "cpu"
    name = str(info.get("name", "")).upper()
    for key, profile in (
        ("H200", "h200"),
        ("H100", "h100"),
        ("A100", "a100"),
        ("6000", "rtx6000-ada"),
    ):
        if key in name:
            return profile
    return "h100"


def kv_plan(spec: ProbeSpec, model: ModelProfile, elem: int, comps: list[Composition]):
    """(compositions that fit, skipped labels, blocks per pool, pools) within the memory
    budget left after the weights."""
    import torch

    if spec.device == "cuda":
        free, _total = torch.cuda.mem_get_info()
    else:
        free = _available_ram()
    weights = model.num_params * elem
    # Activations: logits [batch, vocab] and the attention splits, with room to spare.
    biggest = max(c.batch for c in comps)
    act = 4 * biggest * (model.vocab_size + 64 * model.q_dim) * 4 + (
        2 << 30 if spec.device == "cuda" else 0
    )
    budget = free * spec.memory_fraction - weights - act
    per_block = 2 * spec.block_size * model.kv_dim * elem  # K and V of one block, one pool
    fit = [c for c in comps if c.num_blocks(spec.block_size) * per_block <= budget]
    skipped = [c.label for c in comps if c not in fit]
    if not fit:
        raise RuntimeError(
            f"not enough memory: {free / 2**30:.1f} GiB free, weights {weights / 2**30:.1f} GiB"
        )
    blocks = max(c.num_blocks(spec.block_size) for c in fit)
    pools = int(max(1, min(model.num_layers, budget // (blocks * per_block))))
    return fit, skipped, blocks, pools


def _available_ram() -> int:
    return _meminfo("MemAvailable") or 4 << 30


def _meminfo(key: str) -> int:
    """A /proc/meminfo field in bytes (0 when unreadable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
