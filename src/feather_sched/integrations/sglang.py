"""Deprecated: SGLang's entry point is `feather_sched.sglang:register`."""

from feather_sched.integrations._deprecated import warn_moved
from feather_sched.sglang.plugin import register

warn_moved("feather_sched.integrations.sglang", "feather_sched.sglang")
__all__ = ["register"]
