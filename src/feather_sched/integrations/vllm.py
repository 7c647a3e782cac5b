"""Deprecated: `--scheduler-cls feather_sched.vllm.FeatherScheduler`."""

from feather_sched.integrations._deprecated import warn_moved
from feather_sched.vllm.scheduler import FeatherAsyncScheduler, FeatherScheduler

warn_moved("feather_sched.integrations.vllm", "feather_sched.vllm")
__all__ = ["FeatherAsyncScheduler", "FeatherScheduler"]
