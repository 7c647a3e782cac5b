"""Trace files: the public Mooncake format (read) and Feather's JSONL (read and write).

Mooncake traces carry `hash_ids` (one per block of equal content), not tokens: each id becomes a
fixed pseudo-random block, so the trace's sharing survives exactly. Feather's JSONL holds the
tokens, one request a line (`id`, `arrival`, `output_len`, `prompt`, optional `group`, `meta`,
`max_tokens` and `ignore_eos`), and round-trips. A request without `max_tokens` (every Mooncake
line) gets a client's default cap above its output (`caps.client_cap`); with `ignore_eos` its
cap is its output. Readers keep file order and raise `TraceFormatError` naming the file, line
and field, and refuse values no real trace holds (a unit error, a prompt beyond any model)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from feather_lab.workloads.base import require_int, require_vocab
from feather_lab.workloads.caps import client_cap
from feather_sched.request import Request

__all__ = [
    "TraceFormatError",
    "TraceWorkload",
    "detect_format",
    "read_jsonl",
    "read_mooncake",
    "read_trace",
    "write_jsonl",
]

INT32_MAX = int(np.iinfo(np.int32).max)
MOONCAKE_BLOCK_SIZE = 512
JSONL_FIELDS = frozenset(
    {"id", "arrival", "output_len", "prompt", "group", "meta", "max_tokens", "ignore_eos"}
)
MOONCAKE_FIELDS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})
MAX_TRACE_TOKENS = 10_000_000
"""Most tokens a trace's prompt or output may hold: 10M, the longest context any model
serves (Llama 4 Scout); more is a broken trace, not a workload."""
MAX_TRACE_SECONDS = 1e10
"""Latest arrival a trace may give, in seconds (~317 years; Unix time now is ~1.8e9 s):
beyond it the timestamps are in another unit."""
_TOO_LONG = "over any model's context; no real trace holds one"
_TOO_LATE = "centuries; are the timestamps in another unit (ms, us, ns)?"


class TraceFormatError(ValueError):
    """A trace line that cannot be read; the message names file, line and field."""

    def __init__(self, path: str | os.PathLike, line: int, field: str | None, problem: str):
        self.path = str(path)
        self.line = line
        self.field = field
        where = f"{self.path}: line {line}"
        if field is not None:
            where += f": field {field!r}"
        self.problem = problem
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):  # keep the exception picklable despite the custom signature
        return (type(self), (self.path, self.line, self.field, self.problem))


# ----------------------------------------------------------------------------- line reading


def _records(path: Path, limit: int | None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (1-based line number, parsed object) for each non-blank line, up to `limit`."""
    if limit is not None:
        require_int("read", "limit", limit, 0)
    count = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if limit is not None and count >= limit:
                return
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise TraceFormatError(path, lineno, None, f"invalid JSON ({err})") from None
            if not isinstance(obj, dict):
                raise TraceFormatError(
                    path, lineno, None, f"expected a JSON object, got {type(obj).__name__}"
                )
            count += 1
            yield lineno, obj


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class _Line:
    """Field checkers bound to one line, so each error names file, line and field."""

    def __init__(self, path: Path, lineno: int, obj: dict[str, Any]):
        self.path, self.lineno, self.obj = path, lineno, obj

    def error(self, field: str | None, problem: str) -> TraceFormatError:
        return TraceFormatError(self.path, self.lineno, field, problem)

    def get(self, field: str) -> Any:
        if field not in self.obj:
            raise self.error(field, "missing")
        return self.obj[field]

    def integer(self, field: str, minimum: int, maximum: int = MAX_TRACE_TOKENS) -> int:
        """An integer in [minimum, maximum] (default: a token count no real trace exceeds)."""
        value = self.get(field)
        if type(value) is not int:
            raise self.error(field, f"expected an integer, got {_type_name(value)} {value!r}")
        if value < minimum:
            raise self.error(field, f"must be >= {minimum}, got {value}")
        if value > maximum:
            raise self.error(field, f"{value:,} is over {maximum:,} tokens: {_TOO_LONG}")
        return value

    def seconds(self, field: str, unit: float = 1.0, name: str = "s") -> float:
        """A time >= 0 in units of `unit` seconds called `name` (Mooncake: 1e-3, "ms"), at
        most MAX_TRACE_SECONDS."""
        value = self.get(field)
        if type(value) not in (int, float):
            raise self.error(field, f"expected a number, got {_type_name(value)} {value!r}")
        if not math.isfinite(value) or value < 0:
            raise self.error(field, f"must be finite and >= 0, got {value}")
        if value * unit > MAX_TRACE_SECONDS:
            limit = MAX_TRACE_SECONDS / unit
            raise self.error(field, f"{value:.4g} {name} is over {limit:.0e} {name}: {_TOO_LATE}")
        return float(value)

    def int_list(self, field: str, minimum: int, maximum: int | None = None) -> np.ndarray:
        value = self.get(field)
        if not isinstance(value, list):
            raise self.error(field, f"expected a list of integers, got {_type_name(value)}")
        if set(map(type, value)) - {int}:
            i = next(i for i, v in enumerate(value) if type(v) is not int)
            raise self.error(
                f"{field}[{i}]", f"expected an integer, got {_type_name(value[i])} {value[i]!r}"
            )
        if not value:
            return np.zeros(0, dtype=np.int64)
        try:
            arr = np.array(value, dtype=np.int64)
        except OverflowError:
            i = next(i for i, v in enumerate(value) if not -(2**63) <= v < 2**63)
            raise self.error(f"{field}[{i}]", f"value {value[i]} is out of range") from None
        bad = arr < minimum if maximum is None else (arr < minimum) | (arr > maximum)
        if bad.any():
            i = int(np.argmax(bad))
            bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise self.error(f"{field}[{i}]", f"must be {bounds}, got {value[i]}")
        return arr


# ----------------------------------------------------------------------------- Mooncake


def read_mooncake(
    path: str | os.PathLike,
    *,
    block_size: int = MOONCAKE_BLOCK_SIZE,
    vocab_size: int = 32000,
    seed: int = 0,
    limit: int | None = None,
) -> list[Request]:
    """Read a Mooncake trace (timestamp ms, input_length, output_length, hash_ids per line).

    Each hash id becomes a fixed block of `block_size` tokens drawn from
    default_rng([seed, hash_id]) (cached per id), so requests with equal
    leading ids get equal token prefixes. `limit` reads only the first `limit`
    requests. Request ids are "mc-NNNNNN" in file order; meta holds the 1-based
    "line" and the "hash_ids". Extra fields on a line are ignored (later
    Mooncake traces add some).
    """
    path = Path(path)
    require_int("read_mooncake", "block_size", block_size, 1)
    require_vocab("read_mooncake", vocab_size)
    require_int("read_mooncake", "seed", seed, 0)
    blocks: dict[int, np.ndarray] = {}

    def block(hash_id: int) -> np.ndarray:
        tokens = blocks.get(hash_id)
        if tokens is None:
            rng = np.random.default_rng([seed, hash_id])
            tokens = rng.integers(0, vocab_size, size=block_size, dtype=np.int32)
            blocks[hash_id] = tokens
        return tokens

    requests: list[Request] = []
    for lineno, obj in _records(path, limit):
        line = _Line(path, lineno, obj)
        timestamp = line.seconds("timestamp", unit=1e-3, name="ms")
        input_length = line.integer("input_length", 1)
        output_length = line.integer("output_length", 1)
        ids = _hash_ids(line, input_length, block_size)
        prompt = np.concatenate([block(h) for h in ids])[:input_length]
        requests.append(
            Request(
                request_id=f"mc-{len(requests):06d}",
                prompt=prompt,
                output_len=output_length,
                arrival_time=timestamp / 1000.0,
                meta={"line": lineno, "hash_ids": ids},
                max_tokens=client_cap(output_length),
            )
        )
    return requests


def _hash_ids(line: _Line, input_length: int, block_size: int) -> list[int]:
    """A Mooncake line's block ids: present, one per `block_size` tokens of its prompt."""
    if "hash_ids" not in line.obj:
        raise line.error(
            "hash_ids",
            f"missing: a Mooncake line needs hash_ids, one id per {block_size}-token "
            "block of its prompt (equal ids: equal blocks); without them the trace's "
            "shared prefixes are unknown",
        )
    hash_ids = line.int_list("hash_ids", 0)
    need = -(-input_length // block_size)
    if hash_ids.size != need:
        raise line.error(
            "hash_ids",
            f"has {hash_ids.size} ids but input_length {input_length} needs "
            f"ceil({input_length}/{block_size}) = {need} blocks of {block_size} tokens",
        )
    return [int(h) for h in hash_ids]


# ----------------------------------------------------------------------------- own JSONL


def _to_record(request: Request) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": request.request_id,
        "arrival": float(request.arrival_time),
        "output_len": int(request.output_len),
        "prompt": request.prompt.tolist(),
        "max_tokens": int(request.max_tokens or request.output_len),
    }
    if request.ignore_eos:
        record["ignore_eos"] = True
    if request.group is not None:
        record["group"] = request.group
    if request.meta:
        record["meta"] = request.meta
    return record


def write_jsonl(path: str | os.PathLike, requests: Iterable[Request]) -> None:
    """Write requests one JSON object per line, in the order given.

    `meta` is written when non-empty and must hold JSON values (a tuple comes
    back as a list). Duplicate ids are refused, since read_jsonl would refuse them.
    """
    path = Path(path)
    seen: set[str] = set()
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for request in requests:
            if request.request_id in seen:
                raise ValueError(f"duplicate request id {request.request_id!r}; ids must be unique")
            seen.add(request.request_id)
            try:
                text = json.dumps(_to_record(request), separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as err:
                raise ValueError(
                    f"request {request.request_id!r}: meta is not JSON-serializable ({err})"
                ) from None
            f.write(text + "\n")


def read_jsonl(path: str | os.PathLike, *, limit: int | None = None) -> list[Request]:
    """Read our JSONL format back, checking every field; file order is kept.

    Unknown fields are an error (they are usually typos), as are duplicate ids
    (the message names both lines) and empty prompts.
    """
    path = Path(path)
    requests: list[Request] = []
    first_line: dict[str, int] = {}
    for lineno, obj in _records(path, limit):
        line = _Line(path, lineno, obj)
        unknown = sorted(set(obj) - JSONL_FIELDS)
        if unknown:
            raise line.error(
                unknown[0], f"unknown field (expected only {', '.join(sorted(JSONL_FIELDS))})"
            )
        request_id = line.get("id")
        if not isinstance(request_id, str) or not request_id:
            raise line.error("id", f"expected a non-empty string, got {request_id!r}")
        if request_id in first_line:
            raise line.error(
                "id", f"duplicate id {request_id!r} (first used on line {first_line[request_id]})"
            )
        first_line[request_id] = lineno
        arrival = line.seconds("arrival")
        output_len = line.integer("output_len", 1)
        prompt = line.int_list("prompt", 0, INT32_MAX)
        if prompt.size == 0:
            raise line.error("prompt", "must hold at least one token")
        if prompt.size > MAX_TRACE_TOKENS:
            raise line.error(
                "prompt", f"{prompt.size:,} tokens is over {MAX_TRACE_TOKENS:,}: {_TOO_LONG}"
            )
        group = obj.get("group")
        if group is not None and not isinstance(group, str):
            raise line.error("group", f"expected a string or null, got {_type_name(group)}")
        meta = obj.get("meta", {})
        if not isinstance(meta, dict):
            raise line.error("meta", f"expected an object, got {_type_name(meta)}")
        ignore_eos, max_tokens = _cap(line, output_len)
        requests.append(
            Request(
                request_id=request_id,
                prompt=prompt.astype(np.int32),
                output_len=output_len,
                arrival_time=arrival,
                group=group,
                meta=meta,
                max_tokens=max_tokens,
                ignore_eos=ignore_eos,
            )
        )
    return requests


def _cap(line: _Line, output_len: int) -> tuple[bool, int]:
    """A JSONL line's (`ignore_eos`, `max_tokens`): its own, else a client's default cap (its
    output under `ignore_eos`)."""
    ignore_eos = line.obj.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise line.error("ignore_eos", f"expected true or false, got {ignore_eos!r}")
    if "max_tokens" not in line.obj:
        return ignore_eos, output_len if ignore_eos else client_cap(output_len)
    cap = line.integer("max_tokens", output_len)
    if ignore_eos and cap != output_len:
        raise line.error(
            "max_tokens", f"must equal output_len ({output_len}) under ignore_eos, got {cap}"
        )
    return ignore_eos, cap


# ----------------------------------------------------------------------------- detection


def detect_format(path: str | os.PathLike) -> str | None:
    """ "mooncake" if the first non-blank line has a top-level "hash_ids", or Mooncake's
    other fields and none of ours (so a Mooncake line missing its hash_ids is read as one
    and the error says so); "jsonl" if it is any other object; None for a file with no
    non-blank line."""
    for _, obj in _records(Path(path), 1):
        keys = obj.keys()
        mooncake = "hash_ids" in keys or (keys & MOONCAKE_FIELDS and not keys & JSONL_FIELDS)
        return "mooncake" if mooncake else "jsonl"
    return None


MOONCAKE_ONLY = ("block_size", "vocab_size", "seed")


def read_trace(path: str | os.PathLike, **kw: Any) -> list[Request]:
    """Read either format, chosen by the first non-blank line (see detect_format).

    Keyword options go to the matching reader: read_mooncake takes block_size,
    vocab_size, seed and limit; read_jsonl takes limit. A file with no request
    lines gives an empty list.
    """
    fmt = detect_format(path)
    if fmt == "mooncake":
        return read_mooncake(path, **kw)
    misplaced = [k for k in MOONCAKE_ONLY if k in kw]
    if misplaced:
        raise ValueError(
            f"{path}: option(s) {', '.join(misplaced)} apply only to Mooncake traces, "
            "and this file is in feather JSONL format"
        )
    return [] if fmt is None else read_jsonl(path, **kw)


# ----------------------------------------------------------------------------- as a workload


@dataclass(frozen=True)
class TraceWorkload:
    """A trace file behind the Workload interface (`make_workload("trace:PATH")`).

    generate(seed) reads the file (the seed only picks the Mooncake block
    tokens) and returns the requests sorted stably by arrival time, as every
    generator does. `limit` keeps the first `limit` requests of the file.
    """

    path: Path
    block_size: int = MOONCAKE_BLOCK_SIZE
    vocab_size: int = 32000
    limit: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        require_int("TraceWorkload", "block_size", self.block_size, 1)
        require_vocab("TraceWorkload", self.vocab_size)
        if self.limit is not None:
            require_int("TraceWorkload", "limit", self.limit, 0)

    def generate(self, seed: int) -> list[Request]:
        if not self.path.is_file():
            raise FileNotFoundError(f"trace file not found: {self.path}")
        if detect_format(self.path) == "mooncake":
            requests = read_mooncake(
                self.path,
                block_size=self.block_size,
                vocab_size=self.vocab_size,
                seed=seed,
                limit=self.limit,
            )
        else:
            requests = read_jsonl(self.path, limit=self.limit)
        return _sorted_by_arrival(requests)


def _sorted_by_arrival(requests: Sequence[Request]) -> list[Request]:
    return sorted(requests, key=lambda r: r.arrival_time)  # sorted() is stable
