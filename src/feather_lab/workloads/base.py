"""What every workload generator shares: the protocol, seeding, validation and assembly.

Generators build "drafts" (prompt, output length, group label, meta) in a
structural order, optionally shuffle them, pair them with arrival times and
only then number them, so request ids follow arrival order ("sp-000000" is the
first to arrive).

Seeding: one integer seed is split (numpy SeedSequence.spawn) into independent
streams for token content, for the shuffle and for arrivals. Changing the
arrival process therefore leaves every prompt unchanged, which keeps
comparisons between arrival settings apples to apples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import numpy as np

from feather_lab.workloads.arrivals import AllAtOnce, ArrivalProcess, parse_arrival
from feather_lab.workloads.caps import client_cap
from feather_sched.request import Request

__all__ = [
    "Draft",
    "GeneratorConfig",
    "Streams",
    "Workload",
    "assemble",
    "coerce_arrival",
    "finish",
    "random_tokens",
    "require_int",
    "require_vocab",
    "seed_streams",
]

INT32_MAX = int(np.iinfo(np.int32).max)


@runtime_checkable
class Workload(Protocol):
    """A recipe for a list of requests; the same seed always gives the same list."""

    def generate(self, seed: int) -> list[Request]:
        """Return the requests sorted by arrival time (ties keep generation order)."""
        ...


class Streams(NamedTuple):
    """Independent random streams derived from one workload seed."""

    content: np.random.Generator
    order: np.random.Generator
    arrival: np.random.Generator


def seed_streams(seed: int) -> Streams:
    """Split `seed` into the content, order and arrival streams."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    children = np.random.SeedSequence(int(seed)).spawn(3)
    return Streams(*(np.random.default_rng(c) for c in children))


def random_tokens(
    rng: np.random.Generator, shape: int | tuple[int, ...], vocab_size: int
) -> np.ndarray:
    """Uniform token ids in [0, vocab_size) as int32."""
    return rng.integers(0, vocab_size, size=shape, dtype=np.int32)


def require_int(owner: str, name: str, value: Any, minimum: int) -> None:
    """Raise a ValueError naming the config and field unless value is an int >= minimum."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{owner}.{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}.{name} must be >= {minimum}, got {value}")


def require_vocab(owner: str, vocab_size: Any) -> None:
    """Raise unless vocab_size is an int >= 1 whose largest id fits the int32 prompts."""
    require_int(owner, "vocab_size", vocab_size, 1)
    if vocab_size - 1 > INT32_MAX:
        raise ValueError(f"{owner}.vocab_size must be <= {INT32_MAX + 1}, got {vocab_size}")


def coerce_arrival(owner: object, value: Any) -> None:
    """Accept an arrival spec string in place of a process (handy for CLI overrides).

    Called from a frozen dataclass's __post_init__; replaces the field in place.
    """
    name = type(owner).__name__
    if isinstance(value, str):
        value = parse_arrival(value)
        object.__setattr__(owner, "arrival", value)
    if not isinstance(value, ArrivalProcess):
        raise ValueError(
            f"{name}.arrival must be an arrival process (AllAtOnce, Poisson, Bursts) or a spec "
            f"string, got {value!r}"
        )


INT_TYPES = frozenset({"int", "int | None", int, int | None})
"""Field annotations that `GeneratorConfig` checks as integer counts or lengths (strings
under `from __future__ import annotations`, types without it)."""


@dataclass(frozen=True, kw_only=True)
class GeneratorConfig:
    """Validation shared by every generator config, declared per class as data.

    Base of the frozen generator dataclasses; the two fields every generator has are declared
    here, keyword-only, so they follow each subclass's own fields. On construction,
    every field annotated `int` (or `int | None`) other than vocab_size must be an integer
    >= its entry in MINIMUMS (0 when absent; an entry naming another field bounds it by that
    field's value); a field whose default is None may be None. Then the vocabulary, then
    `check_shape` (the class's own cross-field rules), then the arrival spec. Checks run in
    field order, so with several bad fields the first one declared is the one reported.
    """

    MINIMUMS: ClassVar[dict[str, int | str]] = {"output_len": 1}
    vocab_size: int = 32000
    """Token ids are drawn from [0, vocab_size)."""
    arrival: ArrivalProcess = field(default_factory=AllAtOnce)
    """When requests arrive (a spec string such as "poisson:4" is parsed on construction)."""
    ignore_eos: bool = False
    """The client sets `ignore_eos`: each request's cap is its output, known to the engine.
    Else the cap is a client's default above it (`caps.client_cap`)."""

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.type not in INT_TYPES or f.name == "vocab_size":
                continue
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            minimum = self.MINIMUMS.get(f.name, 0)
            bound = getattr(self, minimum) if isinstance(minimum, str) else minimum
            require_int(owner, f.name, value, bound)
        require_vocab(owner, self.vocab_size)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"{owner}.ignore_eos must be true or false, got {self.ignore_eos!r}")
        self.check_shape(owner)
        coerce_arrival(self, self.arrival)

    def check_shape(self, owner: str) -> None:
        """Cross-field rules (e.g. a prompt of at least one token); none by default."""


@dataclass
class Draft:
    """A request before it has an id and an arrival time."""

    prompt: np.ndarray
    output_len: int
    group: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def assemble(
    id_prefix: str, drafts: Sequence[Draft], arrivals: np.ndarray, ignore_eos: bool = False
) -> list[Request]:
    """Pair drafts with arrival times, sort stably by time and number them in that order;
    each gets its client's cap (`caps.client_cap`), or its own output under `ignore_eos`."""
    arrivals = np.asarray(arrivals, dtype=np.float64)
    if arrivals.shape != (len(drafts),):
        raise ValueError(f"expected {len(drafts)} arrival times, got shape {arrivals.shape}")
    order = np.argsort(arrivals, kind="stable")
    return [
        Request(
            request_id=f"{id_prefix}-{i:06d}",
            prompt=drafts[j].prompt,
            output_len=drafts[j].output_len,
            arrival_time=float(arrivals[j]),
            group=drafts[j].group,
            meta=dict(drafts[j].meta),
            max_tokens=None if ignore_eos else client_cap(drafts[j].output_len),
            ignore_eos=ignore_eos,
        )
        for i, j in enumerate(order)
    ]


def finish(
    id_prefix: str,
    drafts: list[Draft],
    arrival: ArrivalProcess,
    streams: Streams,
    *,
    shuffle: bool,
    ignore_eos: bool = False,
) -> list[Request]:
    """Shuffle drafts (if asked), draw one arrival time each, and assemble."""
    if shuffle:
        drafts = [drafts[i] for i in streams.order.permutation(len(drafts))]
    times = arrival.times(len(drafts), streams.arrival)
    return assemble(id_prefix, drafts, times, ignore_eos)
