"""Deprecated: `feather_sched.ray.FeatherRequestRouter`."""

from feather_sched.integrations._deprecated import warn_moved
from feather_sched.ray.router import FeatherRequestRouter

warn_moved("feather_sched.integrations.ray_serve", "feather_sched.ray")
__all__ = ["FeatherRequestRouter"]
