"""The real-engine policy table's parts that need no engine: the EOS walk rule, the blocks and
their ETA, the verdicts and the page section."""

from __future__ import annotations

import numpy as np
import pytest

from feather_lab.harness.eos_walk import FIRST, terminal_ids, walk_length
from feather_lab.harness.vllm_spec import VllmBenchSpec
from feather_lab.harness.vllm_table import Block, Eta, TableSpec
from feather_lab.harness.vllm_table_page import BEGIN, END, section, verdicts, write_section


def test_terminals_are_seeded_distinct_and_walked_ids() -> None:
    a = terminal_ids(512, 8, 0)
    assert np.array_equal(a, terminal_ids(512, 8, 0))
    assert not np.array_equal(a, terminal_ids(512, 8, 1))
    assert len(set(a.tolist())) == 8 and a.min() >= FIRST and a.max() < 512
    with pytest.raises(ValueError, match=r"1\.\.508"):
        terminal_ids(512, 0, 0)


def test_walk_length_is_one_plus_the_ring_distance_to_the_next_terminal_under_the_cap() -> None:
    ends = np.array([10, 200])
    assert walk_length(10, 128, 512, ends) == 1  # a terminal: EOS next
    assert walk_length(9, 128, 512, ends) == 2  # 10, then EOS
    assert walk_length(11, 500, 512, ends) == 1 + 189
    assert walk_length(11, 128, 512, ends) == 128  # the cap
    assert walk_length(511, 128, 512, ends) == 1 + 7  # the ring wraps to 4: 4..10 is 7 steps


def _spec(**kw) -> TableSpec:
    bench = VllmBenchSpec(
        model="kv-bound", workloads=("paper-4g", "no-sharing"), policies=("feather",), repeats=2
    )
    return TableSpec(bench, kw.get("eos", ("kv-pressure",)))


def test_blocks_run_both_kv_scenarios_then_the_eos_ones() -> None:
    spec = _spec()
    spec.validate()
    blocks = spec.blocks()
    assert blocks == [
        Block("kv-pressure", True),
        Block("no-pressure", True),
        Block("kv-pressure", False),
    ]
    eos = spec.block_spec(blocks[2])
    assert not eos.ignore_eos and [s.name for s in eos.scenarios] == ["kv-pressure"]
    assert blocks[2].name == "kv-pressure, eos"
    with pytest.raises(ValueError, match="--eos-scenarios"):
        _spec(eos=("nope",)).validate()


def test_eta_prices_each_run_left_by_the_runs_most_like_it() -> None:
    lines: list[str] = []
    eta = Eta(_spec(), lines.append)
    assert len(eta.plan) == 3 * 2 * 2 * 2  # blocks x repeats x workloads x (vllm + feather)
    assert eta.left() is None
    # two finished paper-4g runs of 10 s, one no-sharing run of 2 s, in the first block
    eta.done = [("kv-pressure", "paper-4g", 10.0)] * 2 + [("kv-pressure", "no-sharing", 2.0)]
    per_rep = [10.0, 10.0, 2.0, 2.0]
    assert eta.left() == pytest.approx(sum(per_rep) * 6 - 22.0)
    eta.startups = [5.0]  # the first block's engines took 5 s; two blocks still to start
    assert eta.left() == pytest.approx(sum(per_rep) * 6 - 22.0 + 10.0)
    eta.tick(Block("kv-pressure", True), "kv-pressure/no-sharing/feather/0")
    assert "[4/24]" in lines[-1] and "ETA" in lines[-1]


def _row(workload: str, policy: str, tok_s: float, **kw) -> dict:
    return {"workload": workload, "policy": policy, "output_tok_s": tok_s, **kw}


def test_verdicts_name_rows_below_the_bar_and_changed_outputs() -> None:
    rows = [
        _row("a (kv-pressure)", "vllm-cache-aware", 100.0),
        _row("a (kv-pressure)", "feather", 97.0),
        _row("b (kv-pressure, eos)", "vllm", 50.0, outputs_differing=0),
        _row("b (kv-pressure, eos)", "vllm-cache-aware", 50.0, outputs_differing=0),
        _row("b (kv-pressure, eos)", "feather", 60.0, outputs_differing=3),
    ]
    v = verdicts(rows)
    assert v["feather_vs_cache_aware"] == {"a (kv-pressure)": 0.97, "b (kv-pressure, eos)": 1.2}
    assert v["below_bar"] == ["a (kv-pressure)"]
    assert v["outputs_differing"] == {"b (kv-pressure, eos)": 3}


def test_the_page_section_is_rewritten_between_its_markers(tmp_path) -> None:
    eos = {
        "ignore_eos": False,
        "output_len_quartiles": [1, 20, 45, 80, 128],
        "output_len_mean": 50.5,
        "output_len_cap_mean": 128,
        "output_at_cap": 12,
        "requests": 256,
        "output_len_off_rule": 0,
    }
    rows = [
        _row("p (kv-pressure, eos)", "vllm", 100.0, vs_fcfs=1.0, **eos),
        _row("p (kv-pressure, eos)", "vllm-cache-aware", 100.0, vs_fcfs=1.0),
        _row("p (kv-pressure, eos)", "feather", 150.0, vs_fcfs=1.5, output_tok_s_runs=[140, 160]),
    ]
    record = {
        "rows": rows,
        "complete": True,
        "config": {"policies": ["vllm-cache-aware", "feather"], "repeats": 3},
        "provenance": {"date": "D", "commit": "C", "command": "X"},
        "machine": {"cpu": "cpu", "cores": 2},
    }
    text = section(record)
    throughput = "| 100 | 100 (1.00x) | 150 (1.50x) | 1.500 | 140-160 / 100-100 |"
    assert f"| p (kv-pressure, eos) {throughput}" in text
    assert "| p (kv-pressure, eos) | 128 | 1, 20, 45, 80, 128 | 50.5 | 12 | 256 | 0 | 0 |" in text
    assert "on 1 of 1 rows" in text and "identical under every policy" in text
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    write_section(page, text)
    write_section(page, text)
    got = page.read_text()
    assert got.startswith("# Title\n\n") and got.endswith("\n\nafter\n")
    assert got.count(BEGIN) == 1 and "old" not in got


def test_a_resumed_table_runs_only_the_blocks_its_record_lacks(monkeypatch) -> None:
    """The orchestration only (no engine): blocks run in order, each saved; kept rows of a
    finished block are not run again and stay first."""
    from feather_lab.harness import vllm_suite, vllm_table

    ran: list[tuple[str, bool]] = []

    def fake_bench(spec, on_progress=None, cache=None):
        (scenario,) = spec.scenarios
        ran.append((scenario.name, spec.ignore_eos))
        on_progress(f"{scenario.name}/paper-4g/vllm/0")
        return [{"engine_workload": "paper-4g", "scenario": scenario.name, "policy": "vllm"}]

    monkeypatch.setattr(vllm_suite, "run_vllm_bench", fake_bench)
    saved: list[bool] = []
    kept = [{"engine_workload": "paper-4g", "scenario": "kv-pressure", "policy": "vllm",
             "outputs": "ignore_eos", "workload": "paper-4g (kv-pressure)"}]  # fmt: skip
    rows = vllm_table.run_table(
        _spec(), lambda rows, complete: saved.append(complete), lambda _: None, kept
    )
    assert ran == [("no-pressure", True), ("kv-pressure", False)]
    assert saved == [False, True]
    assert [r["workload"] for r in rows] == [
        "paper-4g (kv-pressure)",
        "paper-4g (no-pressure)",
        "paper-4g (kv-pressure, eos)",
    ]
    assert rows[-1]["outputs"] == "eos"


def test_a_policy_whose_greedy_output_differs_is_counted(monkeypatch) -> None:
    """`outputs_differing`: per run, the requests whose tokens are not the baseline's of the
    same repetition (the engine stood in for: only the counting is under test)."""
    from types import SimpleNamespace

    from feather_lab.harness import vllm_suite
    from feather_lab.harness.vllm_spec import KvScenario
    from feather_sched.policies.registry import make_policy

    host = SimpleNamespace(stats=SimpleNamespace(forced=0, policy_errors=0))
    host.policy = make_policy("fcfs")
    monkeypatch.setattr(vllm_suite, "set_policy", lambda *a: None)
    monkeypatch.setattr(vllm_suite, "scheduler_of", lambda engine: SimpleNamespace(feather=host))
    outputs = {
        "vllm": {"a": (5, 6, 2), "b": (7, 2)},
        "feather": {"a": (5, 6, 2), "b": (7, 8, 2)},
        "vllm-cache-aware": {"a": (5, 6, 2), "b": (7, 2)},
    }

    def fake_run_once(engine, requests, label, record_shapes, ignore_eos):
        assert ignore_eos is False
        return {"output_tok_s": 1.0, "output_token_ids": outputs[label.split("/")[2]]}

    monkeypatch.setattr(vllm_suite, "run_once", fake_run_once)
    spec = VllmBenchSpec(policies=("feather", "vllm-cache-aware"), ignore_eos=False)
    engines = {"vllm": object(), "feather": object()}
    rows = dict(
        vllm_suite.run_repetition(spec, KvScenario("t", 1), engines, {"w": []}, 0, lambda _: None)
    )
    got = {p: row["outputs_differing"] for (_, p), row in rows.items()}
    assert got == {"vllm": 0, "feather": 1, "vllm-cache-aware": 0}
    assert all("output_token_ids" not in row for row in rows.values())
