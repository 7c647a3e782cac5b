"""The KV gate as it was before it learned to put its prefix-cache probe off: every candidate
probed at once, whole, and its peak computed in one go. Kept as a reference: the gate must ADD
and STOP exactly as this one does, on any host (test_kv_gate.py, test_vllm_integration.py).
Test-only code."""

from __future__ import annotations

import numpy as np

from feather_sched.policies.kv_gate import KvGate


class EagerKvGate(KvGate):
    """`KvGate` whose `fits` reads `cached_blocks` for every candidate, before the host
    admits it, and computes the peak only when the bound does not fit."""

    def fits(self, view, request_id: str) -> bool:
        if self._free is None and not self._snapshot(view):
            return True
        bs = view.block_size
        req = view.request(request_id)
        prefill = max(0, -(-req.prompt_len // bs) - view.cached_blocks(request_id))
        remaining = self._reserve(req.output_len, req.meta.get("firm_output", True))
        bound = self._bound + prefill + -(-remaining // bs)
        if bound > self._free and self._peak(prefill, remaining, bs) > self._free:
            self.refusals += 1
            return False
        self._admit(prefill, remaining, bound)
        return True

    def _peak(self, prefill: int, remaining: int, bs: int) -> int:
        """The peak (`KvGate._peak_parts`) as one sorted cumulative sum, the candidate's
        prefill in it."""
        left = np.array([*self._remaining, remaining])
        prefills = np.array([*self._prefill, prefill])
        order = np.argsort(-left, kind="stable")
        grown = -(-left[order] // bs)
        return int(np.max(np.cumsum(prefills[order]) + np.arange(1, len(left) + 1) * grown))
