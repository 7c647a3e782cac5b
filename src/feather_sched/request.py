"""The unit of work every component shares: one generation request."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Request:
    """A prompt to prefill and a number of tokens to decode.

    `prompt` is a 1-D int32 array; it is converted (and copied only when needed)
    on construction so that hashing sees one fixed byte layout everywhere.
    `output_len` is the number of tokens the request will generate (a workload's
    ground truth: the simulator decodes that many). `max_tokens` is the client's cap
    on it (None: the cap is `output_len`), what an engine knows of the output; it learns
    the true length only when the client sets `ignore_eos` (the output is then the cap).
    `group` is a provenance label set by generators for reporting (e.g. which shared
    prefix a prompt came from); schedulers never read it.
    """

    request_id: str
    prompt: np.ndarray
    output_len: int
    arrival_time: float = 0.0
    group: str | None = None
    meta: dict = field(default_factory=dict)
    max_tokens: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty string, got {self.request_id!r}")
        prompt = np.asarray(self.prompt)
        if prompt.ndim != 1:
            raise ValueError(
                f"request {self.request_id}: prompt must be 1-D token ids, got shape {prompt.shape}"
            )
        if prompt.size and not np.issubdtype(prompt.dtype, np.integer):
            raise ValueError(
                f"request {self.request_id}: prompt must hold integer token ids, got {prompt.dtype}"
            )
        if prompt.size and (prompt.min() < 0 or prompt.max() > np.iinfo(np.int32).max):
            raise ValueError(f"request {self.request_id}: token ids must fit in int32 and be >= 0")
        self.prompt = np.ascontiguousarray(prompt, dtype=np.int32)
        if int(self.output_len) < 1:
            raise ValueError(
                f"request {self.request_id}: output_len must be >= 1, got {self.output_len}"
            )
        self.output_len = int(self.output_len)
        self._check_cap()
        if not np.isfinite(self.arrival_time) or self.arrival_time < 0:
            raise ValueError(
                f"request {self.request_id}: arrival_time must be finite and >= 0, "
                f"got {self.arrival_time}"
            )
        self.arrival_time = float(self.arrival_time)

    def _check_cap(self) -> None:
        """The cap bounds the output (and is the output under `ignore_eos`)."""
        if self.max_tokens is None:
            self.max_tokens = self.output_len
            return
        cap = int(self.max_tokens)
        if cap < self.output_len or (self.ignore_eos and cap != self.output_len):
            rule = "== output_len (ignore_eos)" if self.ignore_eos else ">= output_len"
            raise ValueError(
                f"request {self.request_id}: max_tokens must be {rule} "
                f"({self.output_len}), got {self.max_tokens}"
            )
        self.max_tokens = cap

    @property
    def prompt_len(self) -> int:
        return int(self.prompt.size)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, prompt_len={self.prompt_len}, "
            f"output_len={self.output_len}, arrival={self.arrival_time:.3f})"
        )
