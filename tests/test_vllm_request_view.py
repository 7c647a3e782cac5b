"""The tracker's `RequestView` over a live vLLM request (the vLLM adapter's
`SchedulerView.request`) is the `Request` built eagerly from the same request, field for
field, its prompt copied only when read."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from requires import require

pytestmark = pytest.mark.vllm

require("vllm", "vllm", "needs the real vLLM engine: pip install -e '.[vllm]' (see pyproject)")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.request import Request as VllmRequest  # noqa: E402

from feather_sched.host.tracker import RequestTracker, RequestView  # noqa: E402
from feather_sched.request import Request  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(4, 50_000), min_size=1, max_size=300),
    max_tokens=st.integers(1, 5000),
    ignore_eos=st.booleans(),
    arrival=st.floats(0, 2e9),
)
def test_same_request_as_built_eagerly(tokens, max_tokens, ignore_eos, arrival) -> None:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
    vreq = VllmRequest("r", tokens, params, None, arrival_time=arrival)
    tracker = RequestTracker(block_size=16)
    tracker.waiting(vreq, now=arrival + 1.0)
    eager = Request("r", np.asarray(tokens), max_tokens, arrival, meta={"firm_output": ignore_eos})
    view = tracker.request("r")
    assert isinstance(view, RequestView) and view is tracker.request("r")
    assert view._prompt is None  # nothing copied yet
    for field in ("request_id", "prompt_len", "output_len", "arrival_time", "group", "meta"):
        assert getattr(view, field) == getattr(eager, field), field
    assert view._prompt is None  # reading the length copied nothing
    assert view.prompt.dtype == np.int32 and np.array_equal(view.prompt, eager.prompt)
    assert view.prompt is view.prompt  # copied once
