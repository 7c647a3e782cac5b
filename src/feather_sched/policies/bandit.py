"""The Feather bandit's table: ADD/STOP statistics per discrete state, and a conservative
choice between them.

ADD is the status quo (what vLLM and SGLang do). The choice follows conservative bandits (Wu,
Shariff, Lattimore, Szepesvari, ICML 2016): ADD unless STOP beats it with confidence (a
one-sided Welch test on the arms' means), or STOP is uncertain and the caller's exploration
budget pays for trying it. A cost model's prior on the gain combines with the data by
precision. Evidence fades with each decision in a state (discounted bandits, Garivier and
Moulines, ALT 2011), so an arm no longer played is sampled again as rewards drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ADD, STOP = 0, 1


def coarse_key(key: tuple[int, ...]) -> tuple[int, int]:
    """The back-off state of a fine (batch, lost, group) bin: (group - batch, lost)."""
    batch, lost, group = key
    return (group - batch, lost)


@dataclass(slots=True)
class Arm:
    """One action's record in one state: pulls (decisions taken, rewards may be pending) and
    the running mean and variance of the rewards received (Welford, with weights: `fade`
    discounts the rewards received so far, so `n` is an effective count; pulls do not fade,
    so an untried STOP is still tried at most `MIN_REWARDS` times)."""

    pulls: int = 0
    n: float = 0
    mean: float = 0.0
    m2: float = 0.0

    def fade(self, keep: float) -> None:
        """Weigh the rewards received so far by `keep` (the mean stays; its evidence
        shrinks)."""
        self.n *= keep
        self.m2 *= keep

    def add(self, reward: float) -> None:
        self.n += 1
        delta = reward - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (reward - self.mean)

    def var(self) -> float:
        """Sample variance; unknown (inf) below two rewards."""
        return self.m2 / (self.n - 1) if self.n > 1 else math.inf

    def to_list(self) -> list[float]:
        return [self.pulls, self.n, self.mean, self.m2]


@dataclass(frozen=True, slots=True)
class Choice:
    action: int
    exploring: bool
    """A STOP taken to learn (paid from the exploration budget), not because it is known
    to win."""
    cost: float = 0.0
    """What the exploration is charged, in units of one decision's reward."""
    lead: float = 0.0
    """A confident STOP's estimated gain over ADD (data and prior combined: a step-time
    saving relative to the slower action, `hold.stop_charge`); 0 for every other choice."""


def combine(data: tuple[float, float], prior: tuple[float, float] | None) -> tuple[float, float]:
    """Precision-weighted mean and standard error of two estimates (gain, se); an estimate
    with an infinite error counts for nothing."""
    if prior is None or math.isinf(prior[1]):
        return data
    if math.isinf(data[1]):
        return prior
    wd, wp = max(data[1], 1e-12) ** -2, max(prior[1], 1e-12) ** -2
    return (wd * data[0] + wp * prior[0]) / (wd + wp), (wd + wp) ** -0.5


FORGET_DECISIONS = 64
"""Decisions in a state over which its evidence fades (each weighs what its state knew by
1 - 1/64). Without fading, a bandit confident of STOP never samples ADD again, so one early
burst's evidence decides every later one; faded, the arm no longer played drops below
`MIN_REWARDS` within about a hundred decisions and is sampled again."""

MIN_REWARDS = 2
"""Rewards an arm needs before its variance, and so the test, is defined (the fewest a sample
variance takes)."""


class BanditTable:
    """Per-state ADD/STOP statistics with back-off and the conservative choice.

    Rewards arrive some steps after a decision, and one scheduling pass may ask many times
    before any has arrived; so pulls count at decision time and rewards (tokens/s, divided by
    the caller's `scale` when compared) when they arrive, in the fine state and in its coarse
    state (`coarse_key`). A fine state decides alone once both its arms have `MIN_REWARDS`;
    before that its coarse state, shared by every batch size with the same group-to-batch
    ratio, decides.
    """

    def __init__(self, confidence: float = 1.0, forget: int | None = FORGET_DECISIONS) -> None:
        if confidence < 0:
            raise ValueError(f"confidence must be >= 0, got {confidence}")
        if forget is not None and forget < 1:
            raise ValueError(f"forget must be >= 1 decision or None, got {forget}")
        self.confidence = confidence
        self.keep = 1.0 if forget is None else 1.0 - 1.0 / forget
        """What each decision in a state leaves of its earlier evidence (1: nothing fades)."""
        self.stats: dict[tuple[int, ...], tuple[Arm, Arm]] = {}

    def _row(self, key: tuple[int, ...]) -> tuple[Arm, Arm]:
        row = self.stats.get(key)
        if row is None:
            row = self.stats[key] = (Arm(), Arm())
        return row

    def arms(self, key: tuple[int, ...]) -> tuple[Arm, Arm]:
        """The (ADD, STOP) arms that decide for `key`: its own, or its coarse state's."""
        row = self.stats.get(key)
        if row is not None and min(row[ADD].n, row[STOP].n) >= MIN_REWARDS:
            return row
        return self.stats.get(coarse_key(key)) or (Arm(), Arm())

    def advantage(self, key: tuple[int, ...], scale: float) -> tuple[float, float]:
        """STOP's mean advantage over ADD and its standard error, in units of `scale`
        (inf error while either arm has fewer than MIN_REWARDS)."""
        add, stop = self.arms(key)
        scale = scale or 1.0
        if min(add.n, stop.n) < MIN_REWARDS:
            return 0.0, math.inf
        se = math.sqrt(add.var() / add.n + stop.var() / stop.n)
        return (stop.mean - add.mean) / scale, se / scale

    def choose(
        self,
        key: tuple[int, ...],
        scale: float,
        budget: float,
        untried_cost: float = 0.5,
        prior: tuple[float, float] | None = None,
    ) -> Choice:
        """ADD unless STOP wins with confidence, or is uncertain and `budget` (in units of
        one decision's reward) covers what trying it may cost.

        With neither a prior nor both arms at `MIN_REWARDS`, STOP is tried at most
        `MIN_REWARDS` times at `untried_cost` each (then ADD, the default, gathers its own
        rewards). Otherwise the gain (data and prior combined) decides; while it is
        uncertain, the less-tried arm is sampled, and an exploratory STOP costs ADD's lead
        over STOP's lower confidence bound: a STOP that is probably no worse is cheap, one
        that may be much worse is dear, and one that is worse with confidence is never tried
        again.
        """
        add, stop = self.arms(key)
        gain, se = combine(self.advantage(key, scale), prior)
        z = self.confidence
        if math.isinf(se):  # no prior, and the arms lack the rewards for a test
            if stop.pulls < MIN_REWARDS and untried_cost <= budget:
                return Choice(STOP, True, untried_cost)
            return Choice(ADD, False)
        if gain - z * se > 0:
            return Choice(STOP, False, lead=gain)
        cost = z * se - gain
        # Uncertain: sample the less-tried arm (ADD costs nothing; STOP, its cost).
        if gain + z * se < 0 or cost > budget or stop.pulls > add.pulls:
            return Choice(ADD, False)
        return Choice(STOP, True, cost)

    def exploit(
        self, key: tuple[int, ...], scale: float = 1.0, prior: tuple[float, float] | None = None
    ) -> Choice:
        """The exploitation-only choice (no budget): STOP only when it wins with confidence."""
        return self.choose(key, scale, budget=-1.0, prior=prior)

    def greedy(
        self, key: tuple[int, ...], scale: float = 1.0, prior: tuple[float, float] | None = None
    ) -> int:
        """`exploit`'s action."""
        return self.exploit(key, scale, prior).action

    def pull(self, key: tuple[int, ...], action: int) -> None:
        """A decision in `key` (and its coarse state): earlier evidence fades, `action` is
        pulled."""
        for k in (key, coarse_key(key)):
            row = self._row(k)
            if self.keep < 1.0:
                row[ADD].fade(self.keep)
                row[STOP].fade(self.keep)
            row[action].pulls += 1

    def update(self, key: tuple[int, ...], action: int, reward: float) -> None:
        for k in (key, coarse_key(key)):
            self._row(k)[action].add(reward)

    def to_dict(self) -> dict:
        return {",".join(map(str, k)): [a.to_list() for a in row] for k, row in self.stats.items()}

    @classmethod
    def from_dict(cls, data: dict, confidence: float) -> BanditTable:
        table = cls(confidence)
        for k, v in data.items():
            try:
                key = tuple(int(x) for x in k.split(","))
                arms = tuple(Arm(int(a[0]), float(a[1]), float(a[2]), float(a[3])) for a in v)
            except (ValueError, TypeError, IndexError):
                raise ValueError(f"bad bandit row for state {k!r}: {v!r}") from None
            if len(key) not in (2, 3) or len(arms) != 2:
                raise ValueError(f"bad bandit row for state {k!r}: {v!r}")
            table.stats[key] = (arms[0], arms[1])
        return table
