"""The hold bound: Feather ends admission early at most `max_steps` steps in a row."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feather_sched.policies.hold import HoldBound, StopDelay, stop_charge


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


def test_stop_delay_counts_stop_steps_since_the_head_arrived() -> None:
    delay = StopDelay(share=0.5)
    delay.stopped(now=0.0)
    delay.end_step(step_time=1.0)  # a STOP step, before the head arrived
    delay.end_step(step_time=1.0)  # no STOP
    assert delay.allows(now=2.0, head_arrival=1.5, mean_wait=0.0)  # nothing held since
    delay.stopped(now=2.0)
    delay.stopped(now=2.1)  # a second STOP in the same step: one step held
    delay.end_step(step_time=1.0)  # held 1 s of a 1.5 s wait: over half
    assert not delay.allows(now=3.0, head_arrival=1.5, mean_wait=0.0)
    assert delay.allows(now=3.0, head_arrival=1.5, mean_wait=2.0)  # not the tail yet
    assert delay.vetoes == 1
    assert StopDelay(share=None).allows(now=3.0, head_arrival=1.5, mean_wait=0.0)
    with pytest.raises(ValueError, match="stop_delay_share"):
        StopDelay(share=1.0)


def test_a_stop_step_counts_net_of_what_its_lead_saves() -> None:
    """A STOP leading ADD by s saves s / (1 - s) of each of its seconds for what waits
    behind the batch: the step counts whole at no lead, a quarter less at a lead of 1/5,
    half at 1/3 and not at all from 1/2 on."""
    assert stop_charge(0.0) == stop_charge(-0.3) == 1.0
    assert stop_charge(0.2) == pytest.approx(0.75)
    assert stop_charge(1 / 3) == pytest.approx(0.5)
    assert stop_charge(0.5) == stop_charge(0.9) == 0.0
    delay = StopDelay(share=0.5)
    delay.stopped(now=0.0, lead=1 / 3)
    delay.end_step(step_time=2.0)
    assert delay.held_s == pytest.approx(1.0)
    delay.stopped(now=2.0, lead=0.6)
    delay.stopped(now=2.1, lead=0.0)  # two STOPs in one step: the lesser lead counts
    delay.end_step(step_time=1.0)
    assert delay.held_s == pytest.approx(2.0)
    delay.stopped(now=3.0, lead=0.75)  # a STOP that halves the time or better: free
    delay.end_step(step_time=5.0)
    assert delay.held_s == pytest.approx(2.0)


def _eighths(most: int) -> st.SearchStrategy[float]:
    return st.integers(0, most).map(lambda k: k / 8)


_LEADS = st.lists(st.sampled_from([-0.25, 0.0, 0.5, 0.75]), max_size=2)
"""The leads of a step's STOPs (none: no STOP), each charging its step whole or not at all,
so the brute-force sum stays exact."""


@settings(max_examples=150, deadline=None)
@given(
    st.floats(0.0, 0.9),
    st.lists(st.tuples(_LEADS, _eighths(16), _eighths(8), _eighths(24)), max_size=60),
)
def test_stop_delay_matches_a_brute_force_sum(share: float, steps: list) -> None:
    """Against the definition: the STOP steps that started after the head arrived, each
    charged as its least-leading STOP says, summed (times in eighths of a second, so both
    sums are exact)."""
    delay, now, head, held_steps = StopDelay(share), 0.0, 0.0, []
    for leads, step_time, head_move, mean_wait in steps:
        for lead in leads:
            delay.stopped(now, lead)
        if leads and step_time > 0:
            held_steps.append((now, step_time * max(map(stop_charge, leads))))
        now += step_time
        delay.end_step(step_time)
        head = min(now, head + head_move)  # the head's arrival never moves back
        held = sum(t for at, t in held_steps if at > head)
        expected = held <= share * max(now - head, mean_wait)
        assert delay.allows(now, head, mean_wait) == expected
