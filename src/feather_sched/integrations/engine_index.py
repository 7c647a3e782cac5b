"""The CHT of an engine's waiting and running requests, driven by the engine's own events.

Engine adapters see requests move through hooks that do not always say where a request came
from (vLLM pops a waiting request before it knows whether it will run or be skipped). So every
transition here is an idempotent "ensure" (`waiting`, `running`, `park`, `forget`): calling one
twice, or for a request the index never saw, is safe, and the index can always be brought back
in line by replaying the engine's queues (`resync`).

Digests: vLLM already hashes every full prompt block (`Request.block_hashes`, chained like the
CHT's digests: vllm/v1/core/kv_cache_utils.py `hash_block_tokens`). The first 8 bytes of each
block hash become the int digest, so adding a request costs no token work. With
`chunk_blocks > 1` every `chunk_blocks`-th block hash (plus the last full block, as the CHT's
final partial chunk) makes a coarser chain with the same prefix semantics. Without block hashes
(prefix caching off) the prompt is hashed here with `chunk_digests`.

This module imports nothing from the engines; it works on duck-typed requests with
`request_id`, `prompt_token_ids`, `num_prompt_tokens`, `block_hashes`, `arrival_time` and
`max_tokens`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from feather_sched.index.cht import ChunkedHashTree, RequestState, chunk_digests
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


def chunk_blocks(chunk_tokens: int, block_size: int) -> int:
    """A CHT chunk of `chunk_tokens` in whole engine blocks (the CHT reuses the engine's
    block hashes, so its chunk is a multiple of the block): rounded down, at least one."""
    return max(1, chunk_tokens // block_size)


@dataclass(slots=True)
class _Meta:
    engine_request: Any
    entered: float
    block_digests: list[int] | None = None
    request: Request | None = None


class EngineIndex:
    """A ChunkedHashTree plus per-request metadata, with tolerant transitions.

    `block_size` is the engine's prefix-cache block (the granularity of its block hashes);
    the CHT's chunk is `block_size * chunk_blocks` tokens.
    """

    def __init__(self, block_size: int, chunk_blocks: int = 1) -> None:
        if block_size < 1 or chunk_blocks < 1:
            raise ValueError("block_size and chunk_blocks must be >= 1")
        self.block_size = int(block_size)
        self.chunk_blocks = int(chunk_blocks)
        self.cht = ChunkedHashTree(self.block_size * self.chunk_blocks)
        self._meta: dict[str, _Meta] = {}

    # ------------------------------------------------------------------ transitions
    def waiting(self, req: Any, now: float) -> None:
        """Ensure `req` is WAITING (arrival, preemption, re-queue after a skip)."""
        rid = req.request_id
        meta = self._meta_for(req, now)
        if rid not in self.cht:
            self.cht.add(rid, digests=self._chunk_digests(meta))
        elif self.cht.state(rid) is RequestState.RUNNING:
            meta.entered = now  # a preempted request waits again from now
            self.cht.preempt(rid)

    def running(self, req: Any, now: float) -> None:
        """Ensure `req` is RUNNING (admitted by the engine)."""
        rid = req.request_id
        if rid not in self.cht:
            self.cht.add(rid, digests=self._chunk_digests(self._meta_for(req, now)))
        elif self.cht.state(rid) is RequestState.RUNNING:
            return
        self.cht.admit(rid)

    def park(self, request_id: str) -> None:
        """Take the request out of the CHT but keep its metadata (it left the queue for a
        while, e.g. skipped this step or moved to another engine queue)."""
        if request_id in self.cht:
            self.cht.remove(request_id)

    def forget(self, request_id: str) -> None:
        """The request is gone for good (finished or aborted)."""
        self.park(request_id)
        self._meta.pop(request_id, None)

    def resync(self, running: Iterable[Any], waiting: Iterable[Any], now: float) -> None:
        """Make the CHT hold exactly `running` (RUNNING) and `waiting` (WAITING)."""
        run = {r.request_id: r for r in running}
        wait = {r.request_id: r for r in waiting}
        for rid in [*self.cht.running_ids(), *self.cht.waiting_ids()]:
            if rid not in run and rid not in wait:
                self.park(rid)
        for r in run.values():
            self.running(r, now)
        for r in wait.values():
            self.waiting(r, now)

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

    def block_digests(self, request_id: str) -> list[int]:
        """Int digests of the prompt's full blocks (the prefix cache's keys)."""
        meta = self._meta[request_id]
        if meta.block_digests is None:
            meta.block_digests = self._full_block_digests(meta.engine_request)
        return meta.block_digests

    def request(self, request_id: str) -> Request:
        """The request as feather's `Request` (built once, on first use: it copies the prompt)."""
        meta = self._meta[request_id]
        if meta.request is None:
            r = meta.engine_request
            tokens = r.prompt_token_ids
            prompt = (
                np.asarray(tokens, dtype=np.int32)
                if tokens is not None
                else np.zeros(r.num_prompt_tokens, np.int32)
            )
            meta.request = Request(
                request_id=request_id,
                prompt=prompt,
                output_len=max(1, int(getattr(r, "max_tokens", 1) or 1)),
                arrival_time=max(0.0, float(getattr(r, "arrival_time", 0.0) or 0.0)),
            )
        return meta.request

    # ------------------------------------------------------------------ internals
    def _meta_for(self, req: Any, now: float) -> _Meta:
        meta = self._meta.get(req.request_id)
        if meta is None:
            arrival = getattr(req, "arrival_time", None)
            meta = self._meta[req.request_id] = _Meta(req, now if arrival is None else arrival)
        else:
            meta.engine_request = req
        return meta

    def _full_block_digests(self, req: Any) -> list[int]:
        n_full = req.num_prompt_tokens // self.block_size
        hashes = getattr(req, "block_hashes", None) or ()
        if len(hashes) >= n_full:
            return [hash_to_int(h) for h in hashes[:n_full]]
        tokens = req.prompt_token_ids or ()
        return chunk_digests(tokens[: n_full * self.block_size], self.block_size)

    def _chunk_digests(self, meta: _Meta) -> list[int]:
        req = meta.engine_request
        hashes = getattr(req, "block_hashes", None) or ()
        if len(hashes) >= req.num_prompt_tokens // self.block_size:
            return sample_chain(self.block_digests(req.request_id), self.chunk_blocks)
        # No engine hashes (prefix caching off): hash the prompt once, partial chunk included.
        return chunk_digests(req.prompt_token_ids or (), self.cht.chunk_size)
