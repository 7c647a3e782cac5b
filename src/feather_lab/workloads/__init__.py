"""Workloads: request generators, arrival processes, trace readers and sharing statistics.

Every generator is a frozen dataclass config with `generate(seed) -> list[Request]`
(deterministic per seed, sorted by arrival); `make_workload(name, **overrides)`
builds one by name, including "trace:PATH" for Mooncake or feather JSONL files.
The prefix-sharing generators are one family (`prefix_groups`); the settings that the bench,
training and the engine benches run by name live in one table (`presets`).
"""

from feather_lab.workloads.arrivals import (
    AllAtOnce,
    ArrivalProcess,
    Bursts,
    Poisson,
    parse_arrival,
)
from feather_lab.workloads.base import Workload
from feather_lab.workloads.multi_turn import MultiTurnWorkload
from feather_lab.workloads.no_sharing import NoSharingWorkload
from feather_lab.workloads.prefix_groups import (
    DocumentQAWorkload,
    LongPrefixWorkload,
    SharedPrefixWorkload,
    TreeWorkload,
)
from feather_lab.workloads.registry import WORKLOADS, make_workload
from feather_lab.workloads.stats import TraceStats, render_stats, trace_stats
from feather_lab.workloads.traces import (
    TraceFormatError,
    TraceWorkload,
    read_jsonl,
    read_mooncake,
    read_trace,
    write_jsonl,
)

__all__ = [
    "WORKLOADS",
    "AllAtOnce",
    "ArrivalProcess",
    "Bursts",
    "DocumentQAWorkload",
    "LongPrefixWorkload",
    "MultiTurnWorkload",
    "NoSharingWorkload",
    "Poisson",
    "SharedPrefixWorkload",
    "TraceFormatError",
    "TraceStats",
    "TraceWorkload",
    "TreeWorkload",
    "Workload",
    "make_workload",
    "parse_arrival",
    "read_jsonl",
    "read_mooncake",
    "read_trace",
    "render_stats",
    "trace_stats",
    "write_jsonl",
]
