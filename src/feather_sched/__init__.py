"""Feather: prefix-homogeneity-aware request scheduling for LLM serving.

The scheduler needs numpy, xxhash and packaging only. Engines load it by name:
`feather_sched.vllm.FeatherScheduler` (vLLM's `--scheduler-cls`), `feather_sched.sglang`
(SGLang's plugin entry point), `feather_sched.ray.FeatherRequestRouter` (Ray Serve).
The simulator and the benchmarks are the lab, `feather_lab` (`pip install feather-sched[bench]`).

- `make_policy(name, **options)`, `policy_names()`: policies by name
- `Request`: one request (prompt token ids, output length, arrival time)
"""

from feather_sched._lazy import lazy_exports
from feather_sched.request import Request

__all__ = ["Request", "make_policy", "policy_names"]
__version__ = "0.1.0"

__getattr__ = lazy_exports(
    __name__, dict.fromkeys(["make_policy", "policy_names"], "feather_sched.policies.registry")
)
