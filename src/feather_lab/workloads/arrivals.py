"""Arrival processes: when each of n requests reaches the scheduler.

Schedulers behave very differently under a burst than under a steady trickle
(a burst lets a policy choose among many waiting prefixes at once), so every
workload takes its arrival process as a parameter. Processes are frozen
dataclasses with a `times(n, rng)` method that returns non-decreasing float64
seconds, starting at 0, and draws randomness only from the generator it is
given, so a workload seed fixes the arrivals exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "AllAtOnce",
    "ArrivalProcess",
    "Bursts",
    "Poisson",
    "parse_arrival",
    "require_number",
]

ARRIVAL_SPECS = "'all', 'poisson:RATE' or 'bursts:SIZE:INTERVAL'"


@runtime_checkable
class ArrivalProcess(Protocol):
    """Anything that can place n arrivals on the time axis."""

    @property
    def spec(self) -> str:
        """The string `parse_arrival` turns back into this process."""
        ...

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Return n non-decreasing arrival times in seconds (float64), the first at 0."""
        ...


def require_number(what: str, value: object, *, positive: bool = False, unit: str = "") -> None:
    """Raise a ValueError naming `what` unless value is a finite int or float, >= 0 (or > 0).

    Rates, intervals and think times are plain seconds or per-second numbers: a bool, a
    string, NaN or infinity there is a typo, so it is refused when the config is built.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number{f' ({unit})' if unit else ''}, got {value!r}")
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(
            f"{what} must be finite and {bound}{f' {unit}' if unit else ''}, got {value}"
        )


def _check_count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"number of arrivals must be an integer >= 0, got {n!r}")
    return int(n)


@dataclass(frozen=True)
class AllAtOnce:
    """Every request is waiting at t=0: the offline/batch case (the paper's main setting)."""

    @property
    def spec(self) -> str:
        return "all"

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(_check_count(n), dtype=np.float64)


@dataclass(frozen=True)
class Poisson:
    """Open-loop arrivals at `rate` requests/s with exponential gaps.

    The first request arrives at t=0 and each later one after an exponential
    gap of mean 1/rate, the way serving benchmarks (e.g. SGLang's
    bench_serving --request-rate) pace their clients.
    """

    rate: float

    def __post_init__(self) -> None:
        require_number("Poisson rate", self.rate, positive=True, unit="requests/s")

    @property
    def spec(self) -> str:
        return f"poisson:{self.rate!r}"

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        n = _check_count(n)
        if n == 0:
            return np.zeros(0, dtype=np.float64)
        gaps = rng.exponential(1.0 / self.rate, size=n - 1)
        return np.concatenate([[0.0], np.cumsum(gaps)]).astype(np.float64)


@dataclass(frozen=True)
class Bursts:
    """`burst_size` requests arrive together, one burst every `interval_s` seconds.

    Deterministic: burst k (0-based) arrives at k * interval_s. The last burst
    may be smaller when n is not a multiple of burst_size.
    """

    burst_size: int
    interval_s: float

    def __post_init__(self) -> None:
        if (
            isinstance(self.burst_size, bool)
            or not isinstance(self.burst_size, int)
            or self.burst_size < 1
        ):
            raise ValueError(f"Bursts burst_size must be an integer >= 1, got {self.burst_size!r}")
        require_number("Bursts interval_s", self.interval_s)

    @property
    def spec(self) -> str:
        return f"bursts:{self.burst_size}:{self.interval_s!r}"

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        n = _check_count(n)
        return (np.arange(n) // self.burst_size).astype(np.float64) * float(self.interval_s)


def _bad_spec(spec: str, why: str) -> ValueError:
    return ValueError(f"bad arrival spec {spec!r}: {why}; expected {ARRIVAL_SPECS}")


def parse_arrival(spec: str) -> ArrivalProcess:
    """Turn a command-line string into an arrival process.

    Accepts "all", "poisson:RATE" (requests/s) and "bursts:SIZE:INTERVAL"
    (requests per burst, seconds between bursts); case and surrounding spaces
    are ignored. The inverse is each process's `spec` property.
    """
    if not isinstance(spec, str):
        raise ValueError(f"arrival spec must be a string, got {spec!r}; expected {ARRIVAL_SPECS}")
    parts = [p.strip() for p in spec.strip().lower().split(":")]
    kind, args = parts[0], parts[1:]
    try:
        if kind == "all":
            if args:
                raise _bad_spec(spec, "'all' takes no parameters")
            return AllAtOnce()
        if kind == "poisson":
            if len(args) != 1:
                raise _bad_spec(spec, "'poisson' takes exactly one parameter, the rate")
            return Poisson(_parse_float(spec, "rate", args[0]))
        if kind == "bursts":
            if len(args) != 2:
                raise _bad_spec(spec, "'bursts' takes two parameters, size and interval")
            return Bursts(
                _parse_int(spec, "size", args[0]), _parse_float(spec, "interval", args[1])
            )
    except ValueError as err:
        if str(err).startswith("bad arrival spec"):
            raise
        raise _bad_spec(spec, str(err)) from err
    raise _bad_spec(spec, f"unknown kind {kind!r}")


def _parse_float(spec: str, name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise _bad_spec(spec, f"{name} {text!r} is not a number") from None


def _parse_int(spec: str, name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _bad_spec(spec, f"{name} {text!r} is not an integer") from None
