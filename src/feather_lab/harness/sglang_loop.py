"""SGLang's adder loop, without SGLang: how its scheduler offers requests to an `SGLangQueue`.

The SGLang adapter's tests and `benchmarks/sglang/sglang_pass_standalone.py` drive admission passes
through this, so both follow the same shape of `Scheduler._get_new_batch_prefill_raw`
(python/sglang/srt/managers/scheduler.py: `for req in self.waiting_queue`, `add_one_req`,
break on the first result that is not CONTINUE) over stand-in requests. The real loop, with
SGLang's own classes, is in tests/test_sglang_integration.py and harness/sglang_bench.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from feather_sched.sglang.queue import Offer, SGLangQueue


class StandInReq(SimpleNamespace):
    """What `SGLangQueue` reads off SGLang's `Req` (`rid`, `origin_input_ids`,
    `sampling_params.max_new_tokens`, `prefix_len`); compared by identity, as SGLang's are
    (SGLang puts them in sets)."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__


def kv_need(req: Any) -> int:
    """KV tokens an admission takes: its uncached prompt and its output."""
    cached = getattr(req, "prefix_len", 0)
    return len(req.origin_input_ids) - cached + req.sampling_params.max_new_tokens


def scheduler_loop(
    queue: SGLangQueue, waiting: list, fits: int, kv_tokens: int | None = None
) -> list:
    """One pass in SGLang's loop shape: offer in list order, stop at the first non-admission,
    go on past a skip; the adder here admits `fits` requests and has `kv_tokens` of room
    (None: unknown), each admission taking `kv_need`. Returns the admitted, in order."""
    admitted: list = []
    for r in waiting:
        left = None if kv_tokens is None else kv_tokens - sum(map(kv_need, admitted))
        room = None if left is None else (lambda left=left: left)
        offer = queue.before_offer(r, nothing_admitted=not admitted, room=room)
        if offer is Offer.STOP:
            break
        if offer is Offer.SKIP:
            continue
        ok = len(admitted) < fits
        if ok:
            admitted.append(r)
        queue.after_offer(r, added=ok, proceed=ok, chunked=False)
        if not ok:
            break
    return admitted
