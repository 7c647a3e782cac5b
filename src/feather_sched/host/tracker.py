"""The one request tracker every host keeps: the CHT of its waiting and running requests and
each request's metadata, moved by four transitions (`waiting`, `running`, `park`, `forget`).

Engine hooks do not always say where a request came from, so each transition is an idempotent
"ensure" and `resync` replays the engine's queues; the simulator runs it `strict`, so a
bookkeeping bug raises. Digests reuse vLLM's chained block hashes where it has them (no token
work per request); otherwise the prompt is hashed here. `RequestFields` says how to read a
host's request object, so nothing here imports an engine."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, KeysView, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from feather_sched.index.cht import ChunkedHashTree, chunk_digests
from feather_sched.request import Request


def hash_to_int(block_hash: Any) -> int:
    """A 64-bit int digest from an engine block hash (bytes: its first 8 bytes; int: itself)."""
    if isinstance(block_hash, int):
        return block_hash & 0xFFFF_FFFF_FFFF_FFFF
    return int.from_bytes(bytes(block_hash[:8]), "little")


def sample_chain(digests: Sequence[int], every: int) -> list[int]:
    """Every `every`-th digest of a chain, plus the last one (the final partial chunk)."""
    if every <= 1:
        return list(digests)
    out = list(digests[every - 1 :: every])
    if len(digests) % every:
        out.append(digests[-1])
    return out


def cht_digests(
    block_digests: Sequence[int] | None,
    tokens: Sequence[int] | np.ndarray,
    block_size: int,
    chunk_blocks: int,
) -> list[int]:
    """A prompt's CHT chain, as every host derives it (the simulator and both adapters).

    From the engine's chained digests of the prompt's full blocks when it has them: every
    `chunk_blocks`-th one, plus the last (no second pass over the tokens). Else (prefix
    caching off, or an engine without block hashes: `block_digests=None`) from the tokens,
    hashed at the chunk size, the partial last chunk included."""
    if block_digests is not None:
        return sample_chain(block_digests, chunk_blocks)
    return chunk_digests(tokens, block_size * chunk_blocks)


def chunk_blocks(chunk_tokens: int, block_size: int) -> int:
    """A CHT chunk of `chunk_tokens` in whole engine blocks (the CHT reuses the engine's
    block hashes, so its chunk is a multiple of the block): rounded down, at least one."""
    return max(1, chunk_tokens // block_size)


def _vllm_prompt(req: Any) -> Sequence[int]:
    tokens = req.prompt_token_ids
    # prompt embeddings carry no token ids: a zero prompt of the right length
    return tokens if tokens is not None else np.zeros(req.num_prompt_tokens, np.int32)


def _none(req: Any) -> None:
    return None


def _no_hashes(req: Any) -> Sequence[Any]:
    return ()


@dataclass(frozen=True)
class RequestFields:
    """How to read an engine's request object."""

    request_id: Callable[[Any], str]
    prompt: Callable[[Any], Sequence[int] | np.ndarray]
    """The prompt's token ids."""
    max_tokens: Callable[[Any], int | None]
    arrival_time: Callable[[Any], float | None] = _none
    """When it arrived, on the host's clock (None: when the index first sees it)."""
    block_hashes: Callable[[Any], Sequence[Any] | None] = _no_hashes
    """The engine's chained hashes of the prompt's full blocks (fewer than its full blocks:
    hashed here; None: the host never hashes blocks, so even a prompt shorter than a block
    is hashed here, into one partial chunk)."""
    firm_output: Callable[[Any], bool] = lambda r: False
    """Whether `max_tokens` is the output length (it ignores end-of-sequence), not a bound."""
    request: Callable[[Any], Request] | None = None
    """The host's request as feather's `Request`, where it already holds one (the simulator);
    None: a `RequestView` over the engine's request, made on first use."""
    prompt_len: Callable[[Any], int] | None = None
    """The prompt's length, where the engine keeps it (None: `len` of `prompt`)."""


VLLM_FIELDS = RequestFields(
    request_id=attrgetter("request_id"),
    prompt=_vllm_prompt,
    prompt_len=attrgetter("num_prompt_tokens"),
    max_tokens=lambda r: getattr(r, "max_tokens", None),
    arrival_time=lambda r: getattr(r, "arrival_time", None),
    block_hashes=lambda r: getattr(r, "block_hashes", None) or (),
    firm_output=lambda r: bool(getattr(getattr(r, "sampling_params", None), "ignore_eos", False)),
)
"""vLLM V1's `Request` (vllm/v1/request.py)."""


class RequestView(Request):
    """feather's `Request` over an engine's request, for the policies: the lengths and the
    output bound at once, the prompt's token ids copied into an int32 array only when a
    policy reads `prompt`. Most read only lengths (the KV gate and the cost prior read
    `prompt_len` once a candidate, the grouping judge `output_len` once a request it walks):
    copying a 2,000-token prompt costs ~40 us from vLLM's list, more than the rest of an
    admission. The engine has checked the prompt already, so `Request`'s own checks are not
    repeated."""

    def __init__(self, engine_request: Any, fields: RequestFields, arrived: float) -> None:
        # Request.__init__ would copy the prompt
        self.request_id = fields.request_id(engine_request)
        self.output_len = max(1, int(fields.max_tokens(engine_request) or 1))
        self.arrival_time = max(0.0, float(arrived))
        self.group = None
        firm = fields.firm_output(engine_request)
        self.meta = {"firm_output": firm}
        self.max_tokens, self.ignore_eos = self.output_len, firm
        self._engine_request = engine_request
        self._fields = fields
        self._prompt: np.ndarray | None = None

    @property  # type: ignore[override]
    def prompt(self) -> np.ndarray:
        if self._prompt is None:
            tokens = self._fields.prompt(self._engine_request)
            self._prompt = np.asarray(tokens, dtype=np.int32)
        return self._prompt

    @property
    def prompt_len(self) -> int:
        length = self._fields.prompt_len
        if length is None:
            return len(self._fields.prompt(self._engine_request))
        return int(length(self._engine_request))


@dataclass(slots=True)
class _Meta:
    engine_request: Any
    entered: float
    """When it entered the waiting queue (reset when it is preempted)."""
    arrived: float
    block_digests: list[int] | None = None
    request: Request | None = None
    order: int = 0
    """Rank of its latest entry into the waiting queue among all entries (`order`)."""


class TrackerError(RuntimeError):
    """A strict tracker was asked for a transition that is not a real move (a host's bug)."""


class RequestTracker:
    """A ChunkedHashTree plus per-request metadata and membership, with tolerant transitions.

    `block_size` is the engine's prefix-cache block (the granularity of its block hashes);
    the CHT's chunk is `block_size * chunk_blocks` tokens. `waiting_ids` and `running_ids`
    are the CHT's own membership records as live set views (one record a request, not a copy
    kept beside it), so a host can diff its engine's lists against them with C-level set
    operations (SGLang) or test membership in O(1). `strict=True` raises
    `TrackerError` on a transition that is not a real move (the simulator's setting).
    """

    def __init__(
        self,
        block_size: int,
        chunk_blocks: int = 1,
        fields: RequestFields = VLLM_FIELDS,
        strict: bool = False,
    ) -> None:
        if block_size < 1 or chunk_blocks < 1:
            raise ValueError("block_size and chunk_blocks must be >= 1")
        self.block_size = int(block_size)
        self.chunk_blocks = int(chunk_blocks)
        self.fields = fields
        self.strict = strict
        self.cht = ChunkedHashTree(self.block_size * self.chunk_blocks)
        self._meta: dict[str, _Meta] = {}
        self.waiting_ids: KeysView[str] = self.cht.waiting_set
        self.running_ids: KeysView[str] = self.cht.running_set
        self.hashed = 0
        """Prompts hashed here (not by the engine), each once, when first seen."""
        self._entries = itertools.count()

    # ------------------------------------------------------------------ transitions
    def waiting(self, req: Any, now: float) -> None:
        """Ensure `req` is WAITING (arrival, preemption, re-queue after a skip)."""
        rid = self.fields.request_id(req)
        meta = self._meta_for(req, now)
        if rid not in self.cht:
            self.cht.add(rid, digests=self._chunk_digests(meta))
        elif rid in self.running_ids:
            meta.entered = now  # a preempted request waits again from now
            self.cht.preempt(rid)
        else:
            return self._not_a_move(rid, "waiting", "it is already waiting")
        meta.order = next(self._entries)

    def running(self, req: Any, now: float) -> None:
        """Ensure `req` is RUNNING (admitted by the engine)."""
        rid = self.fields.request_id(req)
        if rid in self.running_ids:
            return self._not_a_move(rid, "running", "it is already running")
        if rid not in self.cht:
            self._not_a_move(rid, "running", "it never waited")
            self.cht.add(rid, digests=self._chunk_digests(self._meta_for(req, now)))
        self.cht.admit(rid)

    def park(self, request_id: str) -> None:
        """Take the request out of the CHT but keep its metadata (it left the queue for a
        while, e.g. skipped this step or moved to another engine queue)."""
        if request_id in self.cht:
            self.cht.remove(request_id)

    def forget(self, request_id: str) -> None:
        """The request is gone for good (finished or aborted)."""
        if request_id not in self._meta:
            self._not_a_move(request_id, "forget", "it is not tracked")
        self.park(request_id)
        self._meta.pop(request_id, None)

    def resync(self, running: Iterable[Any], waiting: Iterable[Any], now: float) -> None:
        """Make the CHT hold exactly `running` (RUNNING) and `waiting` (WAITING)."""
        rid_of = self.fields.request_id
        run = {rid_of(r): r for r in running}
        wait = {rid_of(r): r for r in waiting}
        for rid in [*self.running_ids, *self.waiting_ids]:
            if rid not in run and rid not in wait:
                self.park(rid)
        for r in run.values():
            if rid_of(r) not in self.running_ids:
                self.running(r, now)
        for r in wait.values():
            if rid_of(r) not in self.waiting_ids:
                self.waiting(r, now)

    def _not_a_move(self, request_id: str, op: str, why: str) -> None:
        if self.strict:
            raise TrackerError(f"tracker: {op}({request_id!r}) is not a move: {why}")

    # ------------------------------------------------------------------ queries
    def __contains__(self, request_id: object) -> bool:
        return request_id in self.cht

    def __len__(self) -> int:
        return len(self.cht)

    @property
    def num_tracked(self) -> int:
        """Requests with metadata (in the CHT, or parked)."""
        return len(self._meta)

    def entered(self, request_id: str) -> float:
        return self._meta[request_id].entered

    def order(self, request_id: str) -> int:
        """Rank of the request's latest entry into the waiting queue: an engine that appends
        arrivals and re-queued requests to its list keeps the list sorted by it."""
        return self._meta[request_id].order

    def engine_request(self, request_id: str) -> Any:
        """The engine's own request object (the latest one seen under this id)."""
        return self._meta[request_id].engine_request

    def block_digests(self, request_id: str) -> list[int]:
        """Int digests of the prompt's full blocks (the prefix cache's keys)."""
        meta = self._meta[request_id]
        if meta.block_digests is None:
            meta.block_digests = self._full_block_digests(meta.engine_request)
        return meta.block_digests

    def request(self, request_id: str) -> Request:
        """The request as feather's `Request`: the host's own (`RequestFields.request`), or a
        `RequestView` over the engine's; made once, on first use."""
        meta = self._meta[request_id]
        if meta.request is None:
            r, fields = meta.engine_request, self.fields
            made = fields.request
            meta.request = made(r) if made is not None else RequestView(r, fields, meta.arrived)
        return meta.request

    # ------------------------------------------------------------------ internals
    def _meta_for(self, req: Any, now: float) -> _Meta:
        rid = self.fields.request_id(req)
        meta = self._meta.get(rid)
        if meta is None:
            arrival = self.fields.arrival_time(req)
            at = now if arrival is None else arrival
            meta = self._meta[rid] = _Meta(req, at, at)
        else:
            meta.engine_request = req
        return meta

    def _full_block_digests(self, req: Any) -> list[int]:
        tokens = self.fields.prompt(req)
        n_full = len(tokens) // self.block_size
        hashes = self.fields.block_hashes(req)
        if hashes is not None and len(hashes) >= n_full:
            if self.fields.request is not None:  # a feather host: already 64-bit int digests,
                # full blocks only, so its own list is read as is (never written here)
                whole = isinstance(hashes, list) and len(hashes) == n_full
                return hashes if whole else list(hashes[:n_full])
            return [hash_to_int(h) for h in hashes[:n_full]]
        return chunk_digests(tokens[: n_full * self.block_size], self.block_size)

    def _chunk_digests(self, meta: _Meta) -> list[int]:
        req = meta.engine_request
        tokens = self.fields.prompt(req)
        hashes = self.fields.block_hashes(req)
        n_full = len(tokens) // self.block_size
        if hashes is not None and len(hashes) >= n_full:
            if meta.block_digests is None and self.fields.request is None:
                # An engine's hashes: convert only the sampled ones (the chain's), not every
                # block's; the full digests are made if and when a policy asks for them.
                sampled = sample_chain(hashes[:n_full], self.chunk_blocks)
                return [hash_to_int(h) for h in sampled]
            full = self.block_digests(self.fields.request_id(req))
        else:
            full = None
            self.hashed += 1
        return cht_digests(full, tokens, self.block_size, self.chunk_blocks)
