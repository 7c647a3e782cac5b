"""Timing one callable: CUDA events around a CUDA-graph replay on a GPU (as vLLM replays its
decode steps; eager if capture fails), wall clock on a CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def time_runs(fn: Callable[[], Any], device: str, warmup: int, reps: int, graph: bool):
    """(the times of `reps` runs in seconds, whether a CUDA graph was replayed, note)."""
    if device == "cpu":
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return times, False, ""
    import torch

    run, note, g = fn, "", None
    if graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run = g.replay
        except Exception as err:  # capture is an optimisation: fall back to eager launches
            g, note = None, f"cuda graph capture failed, eager: {type(err).__name__}: {err}"[:300]
            torch.cuda.synchronize()
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del g
    return times, run is not fn, note


def statistic(device: str) -> str:
    """How a composition's runs make its time: the median on a GPU (device time from CUDA
    events); the fastest run on a CPU, where other processes on a shared machine only ever
    add wall-clock time."""
    return "median" if device == "cuda" else "min"


def stat_of(times: list[float], how: str) -> float:
    return min(times) if how == "min" else statistics.median(times)
