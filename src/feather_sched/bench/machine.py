"""A record of the machine a benchmark ran on, stored next to its numbers."""

from __future__ import annotations

import json
import os
import platform


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine_info() -> dict:
    import numpy

    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": numpy.__version__,
    }


def write_record(path: str | os.PathLike, **fields: object) -> None:
    """A benchmark's JSON record: the machine it ran on, then its fields (rows, config)."""
    with open(path, "w") as f:
        json.dump({"machine": machine_info(), **fields}, f, indent=2)
        f.write("\n")
