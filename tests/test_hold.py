"""The hold bound: Feather ends admission early at most `max_steps` steps in a row."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather_sched.policies.hold import HoldBound


def test_a_step_after_max_steps_holds_is_released() -> None:
    hold = HoldBound(max_steps=2)
    assert hold.begin_step() is False
    hold.held()
    assert hold.begin_step() is False  # one held step behind it
    hold.held()
    assert hold.begin_step() is True and hold.releases == 1  # two: this one is released
    assert hold.begin_step() is False  # the count starts again


def test_a_step_without_a_hold_ends_the_streak() -> None:
    hold = HoldBound(max_steps=2)
    hold.begin_step()
    hold.held()
    hold.begin_step()  # no hold in this one
    assert hold.begin_step() is False and hold.streak == 0


def test_unbounded_and_bad_bounds() -> None:
    hold = HoldBound(max_steps=None)
    for _ in range(100):
        assert hold.begin_step() is False
        hold.held()
    with pytest.raises(ValueError, match="max_hold_steps"):
        HoldBound(max_steps=-1)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 6), st.lists(st.booleans(), max_size=80))
def test_never_more_than_max_steps_held_in_a_row(bound: int, holds: list[bool]) -> None:
    """Whatever the policy wants, no run of held steps is longer than the bound."""
    hold, run = HoldBound(max_steps=bound), 0
    for wants_to_hold in holds:
        released = hold.begin_step()
        if wants_to_hold and not released:
            hold.held()
            run += 1
        else:
            run = 0
        assert run <= bound
