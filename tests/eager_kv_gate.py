"""The KV gate as it was before it learned to put its prefix-cache probe off: every candidate
probed at once. Kept as a reference: the gate must ADD and STOP exactly as this one does, on
any host (test_kv_gate.py, test_vllm_integration.py). Test-only code."""

from __future__ import annotations

from feather_sched.policies.kv_gate import KvGate


class EagerKvGate(KvGate):
    """`KvGate` whose `fits` reads `cached_blocks` for every candidate, before the host
    admits it."""

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
