"""Max-homogeneous: a bound that serves one prefix group at a time.

Not a production policy: it shows what batching only requests that share the deepest prefix
buys (maximal KV sharing per batch) and what it costs (small batches; on a workload with no
sharing it degenerates to batch size 1). The group is chosen from the oldest waiting request,
so nothing starves: every group is eventually the oldest one's.
"""

from __future__ import annotations

from collections.abc import Iterator

from feather_sched.index.cht import Key, RequestState
from feather_sched.policies.base import Policy, SchedulerView
from feather_sched.policies.features import shared_depth


class MaxHomogeneousPolicy(Policy):
    """Admit only members of the current prefix group; switch groups once the batch drains.

    Group of the oldest waiting request r0: its waiting holders of the key at the deepest CHT
    depth L >= 1 where at least 2 requests wait (r0 alone if there is none). While a group is
    set, candidates are its waiting members, oldest first (late arrivals of the group join);
    when nothing of it waits and nothing runs, the next group is picked.
    """

    name = "max-homogeneous"

    def __init__(self) -> None:
        self._key: Key | None = None
        self._solo: str | None = None

    @property
    def current_group(self) -> Key | str | None:
        """The group being served: a CHT key, a lone request id, or None."""
        return self._key if self._key is not None else self._solo

    def reset(self) -> None:
        self._key = None
        self._solo = None

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        members = self._members(view)
        if not members and view.num_running == 0:
            # Drained: nothing of the group waits or runs. Serve the oldest request's group.
            self._pick_group(view)
            members = self._members(view)
        yield from members

    # ------------------------------------------------------------------ internals
    def _members(self, view: SchedulerView) -> list[str]:
        index = view.index
        if self._key is not None:
            return index.group_members(self._key)
        rid = self._solo
        if rid is not None and rid in index and index.state(rid) is RequestState.WAITING:
            return [rid]
        return []

    def _pick_group(self, view: SchedulerView) -> None:
        self._key = None
        self._solo = None
        r0 = next(iter(view.waiting_ids()), None)
        if r0 is None:
            return
        index = view.index
        keys = index.keys_of(r0)  # empty for an empty prompt; one key below a chunk
        lo = shared_depth(index, r0)  # deepest depth with a waiting group of >= 2
        if lo >= 1:
            self._key = keys[lo - 1]
        else:
            self._solo = r0
