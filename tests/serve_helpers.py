"""Client-side helpers shared by the Ray Serve tests (`test_ray_serve`, `test_ray_vllm`):
send a burst of requests through a deployment handle, and check each got exactly one answer.
No Ray import here: the callers import Ray (or skip) first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def send_all(
    handle: Any,
    reqs: Sequence[tuple[int, Any]],
    retries: int = 0,
    on_sent: Callable[[], None] | None = None,
    timeout_s: float = 60.0,
) -> tuple[dict[str, list[dict]], int]:
    """Every request (`(group, CompletionRequest)` pairs), concurrently; a failed one (its
    replica died) is sent again, up to `retries` times. Returns {request_id: [answers]} and
    the number of retries."""
    pending = {r.request_id: handle.remote(r) for _, r in reqs}
    by_id = {r.request_id: r for _, r in reqs}
    if on_sent is not None:
        on_sent()
    answers: dict[str, list[dict]] = {rid: [] for rid in by_id}
    retried = 0
    for _ in range(retries + 1):
        failed = []
        for rid, resp in pending.items():
            try:
                answers[rid].append(resp.result(timeout_s=timeout_s))
            except Exception:  # the replica died under it: the client retries
                failed.append(rid)
        if not failed:
            break
        retried += len(failed)
        pending = {rid: handle.remote(by_id[rid]) for rid in failed}
    return answers, retried


def check_exactly_once(answers: dict[str, list[dict]], output_tokens: dict[str, int]) -> None:
    """Each request answered once, by its own id, with the tokens it asked for."""
    assert set(answers) == set(output_tokens)
    for rid, got in answers.items():
        assert len(got) == 1, f"{rid}: {len(got)} answers"
        assert got[0]["request_id"] == rid
        assert got[0]["output_tokens"] == output_tokens[rid], (rid, got[0]["output_tokens"])
