"""Feather in SGLang, loaded through SGLang's plugin entry point (`sglang.srt.plugins`):
installed with the package, inert until `FEATHER_POLICY` or `SGLANG_PLUGINS` names it."""

from feather_sched._lazy import lazy_exports

__all__ = ["register"]
__getattr__ = lazy_exports(__name__, {"register": "feather_sched.sglang.plugin"})
