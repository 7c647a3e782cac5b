"""The decision state Feather's learners see, computed from the CHT in O(log chunks).

For a candidate about to join the running batch:
- batch: how many requests run now;
- lost: chunks of the candidate's *shared* prefix (the part it shares with other waiting
  requests or with the batch) that the batch's main group does not hold. Admitting it would
  bring that prefix into every decode step's working set, splitting the batch's cache reuse.
  A candidate that joins a prefix held by at least half the batch, or that shares nothing
  with anyone (no sharing to lose), has lost == 0; one that joins a minority prefix counts
  its whole shared prefix as lost, since it grows a competing group;
- group: how many waiting requests share that prefix (how much a later, homogeneous batch of
  its own could hold).
Bins are logarithmic so one table covers batches of 1 to 1,000 and prompts of any length.
"""

from __future__ import annotations

from typing import NamedTuple

from feather_sched.index.cht import ChunkedHashTree


class DecisionState(NamedTuple):
    """Made for every candidate a learner sees: a named tuple, as a frozen dataclass costs
    more to build (about a third of `decision_state`'s time in a one-off timeit)."""

    batch: int
    lost_chunks: int
    group: int
    matched_chunks: int
    joins_majority: bool
    """The candidate's prefix is held by at least half the running batch (or it has none)."""
    depth: int = 0
    """Chunks of the candidate's shared prefix (shared with another waiting request)."""

    @property
    def new_chunks(self) -> int:
        """Chunks of its shared prefix that no running request holds: admitting it opens a
        new prefix group in the batch (0: its group already runs, or it shares nothing)."""
        return max(0, self.depth - self.matched_chunks)

    def group_bins(self) -> tuple[int, int, int]:
        """(batch, new chunks, group) bins: the state of a decision to open a new group."""
        return (log2_bin(self.batch, 9), log2_bin(self.new_chunks, 8), log2_bin(self.group, 8))


def log2_bin(value: int, top: int) -> int:
    """0 -> 0, 1 -> 1, 2-3 -> 2, 4-7 -> 3, ... capped at `top`."""
    return min(top, int(value).bit_length())


def shared_depth(index: ChunkedHashTree, request_id: str) -> int:
    """Deepest chunk level this request shares with at least one other waiting request
    (group sizes only shrink with depth: the deepest node of its path with two waiting)."""
    return index.shared_prefix(request_id)[0]


def decision_state(index: ChunkedHashTree, request_id: str) -> DecisionState:
    matched, depth, group, holders = index.sharing_profile(request_id)
    batch = index.num_running
    # no shared prefix at all: nothing to dilute; otherwise does it join the main group?
    majority = depth == 0 or 2 * holders >= batch
    lost = depth - matched if majority else depth
    # positional: keywords cost a third more, once for every candidate an engine offers
    return DecisionState(batch, lost, group, matched, majority, depth)
