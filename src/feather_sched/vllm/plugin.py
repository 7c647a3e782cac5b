"""vLLM general plugin (entry point `feather` in group `vllm.general_plugins`): Feather's
series on the API server's `/metrics`.

vLLM loads general plugins in every process, the API server first (when it builds the engine
config, before the engine core starts). There this names a fresh snapshot directory
(`FEATHER_METRICS_DIR`, host/metrics.py), which the engine core inherits and Feather's
scheduler writes to, and registers the collector that reads it into prometheus_client's
default registry, the one a single API server's `/metrics` serves. Loaded without Feather's
scheduler it exports nothing. No vLLM import here: it runs before the engine exists.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile

from feather_sched.host.metrics import METRICS_DIR_ENV, SnapshotCollector, snapshot_root

__all__ = ["register"]

logger = logging.getLogger("feather_sched")
_registered = False


def register() -> None:
    """Set up the snapshot directory (unless set) and the collector, once per process."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        from prometheus_client import REGISTRY
    except ImportError:  # prometheus_client is vLLM's, not Feather's: no metrics, no error
        return
    directory = os.environ.get(METRICS_DIR_ENV)
    if not directory:
        directory = tempfile.mkdtemp(prefix="feather-metrics-", dir=snapshot_root())
        os.environ[METRICS_DIR_ENV] = directory
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
    REGISTRY.register(SnapshotCollector(directory))
