"""Whether an SGLang scheduler process exports Feather's `feather_*` series, and their owner.

SGLang's `/metrics` exists only with `--enable-metrics`, which sets `PROMETHEUS_MULTIPROC_DIR`
for every process it starts. Of several scheduler processes, those that make distinct
decisions export: SGLang logs its own scheduler stats from the first rank of each attention
group (`SchedulerMetricsCollector.init_new`: `is_stats_logging_rank`), and the other tensor
parallel ranks replay the same schedule, so counting them too would multiply every series.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from feather_sched.host.prometheus_series import PrometheusSeries

__all__ = ["series_for"]

logger = logging.getLogger("feather_sched.sglang")


def metrics_on(scheduler: Any) -> bool:
    """SGLang's metrics are on in this scheduler and it is the rank that reports them."""
    context = getattr(scheduler, "metrics_collector_context", None)
    if context is not None:
        return bool(context.enable_metrics and context.is_stats_logging_rank)
    # releases before the context object: the scheduler's own flag and rank
    return bool(getattr(scheduler, "enable_metrics", False)) and not getattr(
        scheduler, "attn_tp_rank", 0
    )


def series_for(scheduler: Any, policy: str) -> PrometheusSeries | None:
    """The series this scheduler process writes, or None where they would reach no
    `/metrics` (metrics off, another rank's, no multiprocess directory, no client)."""
    if not metrics_on(scheduler):
        return None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        logger.warning("feather metrics off: SGLang's metrics on, no PROMETHEUS_MULTIPROC_DIR")
        return None
    try:
        return PrometheusSeries(policy)
    except ImportError:  # prometheus_client is SGLang's dependency, not Feather's
        logger.warning("feather metrics off: prometheus_client is not installed")
        return None
