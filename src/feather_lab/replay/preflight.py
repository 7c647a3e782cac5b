"""What `feather replay` checks before it sends a workload, and after: every failure found
first is an exit 2 naming the value, and a run whose requests failed is never reported good.

Before: the built-in model named (`--model`) exists; each server serves a model
(`client.preflight`, `/v1/models`); the workloads fit its context (`bench.context`, as they
are built); and the largest token id of the workloads is one its vocabulary holds, found by a
one-token request of that id alone (servers do not list their vocabulary size; vLLM answers
"Token id N is out of vocabulary" with HTTP 400). After: runs where more than `max_failed`
of the requests failed, with their first errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from feather_lab.harness.tiny_llama import ENGINE_MODELS
from feather_lab.replay import native as native_api
from feather_lab.replay.client import Endpoint, EndpointError

DEFAULT_MAX_FAILED = 0.01
"""The share of a run's requests that may fail before the command exits non-zero."""


def check_model(model: str | None) -> None:
    """A ValueError naming `--model` and the valid ones, unless it is a built-in model."""
    if model is not None and model not in ENGINE_MODELS:
        raise ValueError(
            f"--model {model!r} is not a built-in engine model; valid: "
            f"{', '.join(ENGINE_MODELS)}, or leave it out (the simulator suite's workloads; "
            "--vocab-size for the server's vocabulary)"
        )


def largest_token_id(workloads: Sequence[Any]) -> int:
    return max(int(r.prompt.max()) for w in workloads for r in w.requests if r.prompt_len)


def probe_token_id(endpoint: Endpoint, token_id: int, api: str, timeout_s: float = 60.0) -> None:
    """One request of `token_id` alone and one output token: an EndpointError naming the id
    and the server's answer when the server refuses it."""
    if api == "generate":
        url, body = endpoint.url + native_api.PATH, {"input_ids": [token_id]}
        body["sampling_params"] = {"max_new_tokens": 1}
    else:
        url = endpoint.url + "/v1/completions"
        body = {"model": endpoint.model, "prompt": [token_id], "max_tokens": 1}
    try:
        resp = httpx.post(url, json=body, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise EndpointError(f"{endpoint.url}: probe failed ({type(err).__name__}: {err})") from None
    if resp.status_code != 200:
        raise EndpointError(
            f"{endpoint.url} refuses token id {token_id:,} (the workloads' largest): HTTP "
            f"{resp.status_code}: {resp.text[:300]}. Pass --vocab-size at most the model's "
            "vocabulary (or --model for a built-in one)"
        )


def failed_runs(runs: Sequence[dict[str, Any]], max_failed: float) -> list[str]:
    """A line for each run where more than `max_failed` of its requests failed or were never
    answered, with its first error."""
    lines = []
    for r in runs:
        bad = r["failed"] + r.get("unanswered", 0)
        if bad > max_failed * max(1, r["requests"]):
            lines.append(
                f"{r['workload']} on {r['policy']} (repeat {r.get('repeat', 0)}): {bad} of "
                f"{r['requests']} requests failed; first: {r.get('first_error')}"
            )
    return lines
