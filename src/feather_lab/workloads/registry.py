"""Workloads by name, for the CLI and the benchmark harness.

`make_workload("shared-prefix", num_groups=8)` builds a default config with
overrides; `make_workload("trace:PATH")` wraps a trace file (Mooncake or our
JSONL, detected from its first line). Unknown names and unknown fields fail
with a message that lists what is valid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from feather_lab.workloads.base import Workload
from feather_lab.workloads.multi_turn import MultiTurnWorkload
from feather_lab.workloads.no_sharing import NoSharingWorkload
from feather_lab.workloads.prefix_groups import (
    DocumentQAWorkload,
    LongPrefixWorkload,
    SharedPrefixWorkload,
    TreeWorkload,
)
from feather_lab.workloads.traces import TraceWorkload

__all__ = ["TRACE_PREFIX", "WORKLOADS", "make_workload"]

TRACE_PREFIX = "trace:"

WORKLOADS: dict[str, Callable[..., Workload]] = {
    "shared-prefix": SharedPrefixWorkload,
    "long-prefix": LongPrefixWorkload,
    "document-qa": DocumentQAWorkload,
    "tree": TreeWorkload,
    "multi-turn": MultiTurnWorkload,
    "no-sharing": NoSharingWorkload,
}


def _check_fields(label: str, valid: list[str], overrides: dict[str, Any]) -> None:
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ValueError(
            f"workload {label!r} has no field(s) {', '.join(unknown)}; "
            f"valid fields: {', '.join(valid)}"
        )


def make_workload(name: str, **overrides: Any) -> Workload:
    """Build the named workload, with field overrides (an `arrival` may be a spec string).

    Names: the keys of WORKLOADS, or "trace:PATH" for a trace file (overrides:
    block_size, vocab_size, limit).
    """
    if name.startswith(TRACE_PREFIX):
        path = name[len(TRACE_PREFIX) :]
        if not path:
            raise ValueError(f"workload {name!r}: expected 'trace:PATH' with a file path")
        if Path(path).is_dir():
            raise ValueError(f"workload {name!r}: {path} is a directory; give a trace file")
        if not Path(path).is_file():
            raise FileNotFoundError(f"workload {name!r}: trace file not found: {path}")
        _check_fields(name, [f.name for f in dataclasses.fields(TraceWorkload)][1:], overrides)
        return TraceWorkload(path, **overrides)
    factory = WORKLOADS.get(name)
    if factory is None:
        raise ValueError(
            f"unknown workload {name!r}; valid names: {', '.join(WORKLOADS)}, or 'trace:PATH'"
        )
    if dataclasses.is_dataclass(factory):
        _check_fields(name, [f.name for f in dataclasses.fields(factory)], overrides)
    return factory(**overrides)
