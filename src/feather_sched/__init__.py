"""Feather: prefix-homogeneity-aware request scheduling for LLM serving."""

from feather_sched.request import Request

__all__ = ["Request"]
__version__ = "0.1.0"
