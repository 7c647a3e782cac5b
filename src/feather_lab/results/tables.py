"""The tables docs quote from records, each made by a renderer from the records it declares.

A renderer is a short function that takes the loaded records (in the order it names them) and
returns a markdown table; `@table(NAME, *records)` registers it, and a doc's block
`<!-- table: NAME -->` ... `<!-- /table -->` holds its output (feather_lab.results.blocks).
The columns and the rules (which policies count as "the best of the run", how a ratio is
rounded) live here once, so a re-made record re-renders its tables instead of being copied by
hand.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feather_lab.bench.index_bench import INDEX_COLUMNS, index_cells
from feather_lab.bench.rows import by_workload

Record = dict[str, Any]


@dataclass(frozen=True)
class Table:
    name: str
    records: tuple[str, ...]
    make: Callable[..., str]


TABLES: dict[str, Table] = {}


def table(name: str, *records: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register the decorated function as the renderer of `name`, reading `records` (paths
    from the repository root)."""

    def register(make: Callable[..., str]) -> Callable[..., str]:
        TABLES[name] = Table(name, records, make)
        return make

    return register


def render_table(tab: Table, root: Path) -> str:
    """The markdown `tab` makes of its records under `root`."""
    return tab.make(*(json.loads((root / p).read_text()) for p in tab.records))


def markdown(header: list[str], align: str, rows: list[list[str]]) -> str:
    """A markdown table; `align` has one letter a column, `l` or `r`."""
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    lines = [header, *rows]
    out = ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join([out[0], rule, *out[1:]])


def n0(value: float) -> str:
    """A throughput as the pages print it: whole, with thousands separators."""
    return f"{value:,.0f}"


# --- the simulated suite (`feather bench`) -------------------------------------------------

NOT_RIVALS = ("feather", "max-homogeneous")
"""Rows left out of "the best policy of the run": Feather itself and max-homogeneous (a
bound on grouping, not a policy an engine runs); `bound:` rows are bounds too."""


def suite(record: Record) -> dict[str, dict[str, Record]]:
    """workload -> policy -> row, in the record's order."""
    return by_workload(record["rows"])


def best_other(runs: dict[str, Record]) -> tuple[str, float]:
    """The best policy of one workload's run but Feather (the oracle's caps included)."""
    rivals = {
        p: r["output_tok_s"]
        for p, r in runs.items()
        if p not in NOT_RIVALS and not p.startswith("bound:")
    }
    name = max(rivals, key=lambda p: rivals[p])
    return name, rivals[name]


@dataclass(frozen=True)
class SuiteRow:
    """One workload of a suite record, as Feather's tables read it."""

    workload: str
    fcfs: float
    feather: float
    best_name: str
    best: float
    bounds: dict[str, float]
    runs: dict[str, Record]

    @property
    def over_fcfs(self) -> float:
        return self.feather / self.fcfs

    @property
    def over_best(self) -> float:
        return self.feather / max(self.best, self.feather)

    def ttft_p99(self) -> float:
        return self.runs["feather"]["ttft_p99_s"] / self.runs["fcfs"]["ttft_p99_s"]


def suite_rows(record: Record) -> list[SuiteRow]:
    out = []
    for workload, runs in suite(record).items():
        name, best = best_other(runs)
        bounds = {p: r["output_tok_s"] for p, r in runs.items() if p.startswith("bound:")}
        tok = {p: r["output_tok_s"] for p, r in runs.items()}
        out.append(SuiteRow(workload, tok["fcfs"], tok["feather"], name, best, bounds, runs))
    return out


@table("sim-suite-h200", "benchmarks/sim/bench.json")
def sim_suite_h200(bench: Record) -> str:
    """The default suite on the measured profile: Feather against FCFS, vLLM's cache-aware
    order and the best of the run, and its TTFT p99 over FCFS's."""
    rows = []
    for r in suite_rows(bench):
        vca = r.runs["vllm-cache-aware"]["output_tok_s"]
        bounds = ", ".join(f"{p} {n0(v)}" for p, v in r.bounds.items())
        feather = n0(r.feather) + (f" ({bounds})" if bounds else "")
        rows.append(
            [
                *(r.workload, n0(r.fcfs), n0(vca), f"{r.best_name} {n0(r.best)}", feather),
                *(f"{r.over_fcfs:.3f}", f"{r.feather / vca:.3f}", f"{r.over_best:.3f}"),
                f"{r.ttft_p99():.2f}",
            ]
        )
    header = ["workload", "fcfs", "vllm-cache-aware", "best other policy", "feather"]
    header += ["feather / fcfs", "feather / vllm-cache-aware", "feather / best", "TTFT p99"]
    return markdown(header, "lrrlrrrrr", rows)


@table("sim-suite-derived", "benchmarks/sim/bench-h100.json", "benchmarks/sim/bench-a100.json")
def sim_suite_derived(h100: Record, a100: Record) -> str:
    """The suite on the two derived profiles side by side."""
    header = ["workload"]
    for hw in ("h100", "a100"):
        header += [f"{hw}: fcfs", "best other", "feather", "/ fcfs", "/ best"]
    rows = []
    for a, b in zip(suite_rows(h100), suite_rows(a100), strict=True):
        cells = [a.workload]
        for r in (a, b):
            cells += [n0(r.fcfs), f"{r.best_name} {n0(r.best)}", n0(r.feather)]
            cells += [f"{r.over_fcfs:.3f}", f"{r.over_best:.3f}"]
        rows.append(cells)
    return markdown(header, "l" + "rlrrr" * 2, rows)


@table(
    "feather-suite-ratios",
    "benchmarks/sim/bench.json",
    "benchmarks/sim/bench-h100.json",
    "benchmarks/sim/bench-a100.json",
)
def feather_suite_ratios(h200: Record, h100: Record, a100: Record) -> str:
    """Feather over FCFS / over the best of the run, per profile."""
    columns = [suite_rows(r) for r in (h200, h100, a100)]
    rows = [
        [same[0].workload, *(f"{r.over_fcfs:.3f} / {r.over_best:.3f}" for r in same)]
        for same in zip(*columns, strict=True)
    ]
    return markdown(["workload", "h200", "h100 (derived)", "a100 (derived)"], "llll", rows)


# --- the STOP delay bound (benchmarks/sim/stop_delay_sim.py) -----------------------------

UNBOUNDED = "feather stop_delay_share=None"


def hardware_runs(record: Record, hardware: str) -> dict[str, dict[str, Record]]:
    """workload -> policy -> row of one hardware profile in a stop-delay record."""
    return suite({"rows": [r for r in record["rows"] if r["hardware"] == hardware]})


@table("sim-stop-delay-free-l2", "benchmarks/sim/stop-delay-sim-net.json")
def sim_stop_delay_free_l2(net: Record) -> str:
    """Feather with its STOP delay bound and without, on the free-L2 estimate."""
    rows = []
    for workload, runs in hardware_runs(net, "h100-free-l2").items():
        fcfs, feather = runs["fcfs"], runs["feather"]
        tok = {p: n0(r["output_tok_s"]) for p, r in runs.items()}
        gain = feather["output_tok_s"] / fcfs["output_tok_s"]
        rows.append(
            [
                *(workload, tok["fcfs"], tok["max-homogeneous"]),
                *(f"{tok['feather']} ({gain:.2f}x)", tok[UNBOUNDED]),
                f"{feather['ttft_p99_s']:.2f} / {fcfs['ttft_p99_s']:.2f}",
            ]
        )
    header = ["workload", "fcfs", "max-homogeneous", "feather (x fcfs)"]
    header += ["feather, STOPs unbounded", "TTFT p99 feather / fcfs, s"]
    return markdown(header, "lrrrrr", rows)


@table(
    "feather-prior",
    "benchmarks/sim/bench-noprior.json",
    "benchmarks/sim/bench-mismatched-prior.json",
    "benchmarks/sim/bench-free-l2.json",
)
def feather_prior(noprior: Record, mismatched: Record, own: Record) -> str:
    """Feather over FCFS without a step-cost prior, with another GPU's, and with its own,
    on the free-L2 constants: `feather` as built in all three, so only the prior differs."""
    columns = [suite(noprior), suite(mismatched), suite(own)]

    def gain(runs: dict[str, Record]) -> str:
        return f"{runs['feather']['output_tok_s'] / runs['fcfs']['output_tok_s']:.2f}x"

    rows = [[w, *(gain(c[w]) for c in columns)] for w in columns[0]]
    merged: list[list[str]] = []
    for row in rows:  # workloads that read the same in every column share a row
        if merged and merged[-1][1:] == row[1:] and set(row[1:]) == {"1.00x"}:
            merged[-1][0] += f", {row[0]}"
        else:
            merged.append(row)
    header = ["workload", "no prior", "A100 prior on H100", "H100 prior"]
    return markdown(header, "lrrr", merged)


# --- the simulator's own speed and Feather's decision cost (machine-timed) ----------------


@table("sim-speed", "benchmarks/sim/sim-speed.json")
def sim_speed(speed: Record) -> str:
    rows = [
        [r["policy"], f"{r['cpu_s']:.2f}", f"{r['steps']:,}", f"{r['us_per_step']:.0f}"]
        for r in speed["rows"]
    ]
    return markdown(["policy", "CPU s per run", "steps", "us per step"], "lrrr", rows)


DECIDERS = {"feather+prior": "feather + prior (H100 model)"}


@table("feather-decision-cost", "benchmarks/feather/decision-cost.json")
def feather_decision_cost(cost: Record) -> str:
    rows = [
        [
            DECIDERS.get(r["policy"], r["policy"]),
            f"{r['sched_us_per_decision']:.1f}",
            f"{r['sched_us_per_step']:.0f}",
        ]
        for r in cost["rows"]
    ]
    return markdown(["policy", "us per decision", "us per step"], "lrr", rows)


# --- Feather across runs and its constants (benchmarks/feather/) --------------------------


@table("feather-learning", "benchmarks/feather/feather-learning.json")
def feather_learning(learning: Record) -> str:
    runs = learning["runs"]
    rows = [
        ["feather, learning across runs", *(n0(r["feather"]) for r in runs)],
        ["fcfs", *(n0(r["fcfs"]) for r in runs)],
    ]
    header = ["run (seed)", *(str(r["seed"]) for r in runs)]
    return markdown(header, "l" + "r" * len(runs), rows)


CONSTANTS = {
    "alpha": "`alpha` exploration budget",
    "confidence": "`confidence` z of the test",
    "horizon": "`horizon` steps credited",
}
"""How the constants table names a constant (default: its name)."""
BEATS = 1.005
"""A variant that beats the default by more than this is printed bold."""


def variants(record: Record) -> dict[str, list[Record]]:
    """constant -> its rows (half, then double)."""
    out: dict[str, list[Record]] = {}
    for row in record["rows"]:
        out.setdefault(row["constant"], []).append(row)
    return out


def worst_best(row: Record) -> str:
    best = f"{row['best']:.3f}"
    return f"{row['worst']:.3f} / {f'**{best}**' if row['best'] > BEATS else best}"


@table(
    "feather-constants",
    "benchmarks/feather/bandit-constants.json",
    "benchmarks/feather/bandit-constants-noprior.json",
    "benchmarks/feather/bandit-constants-stopdelay.json",
)
def feather_constants(prior: Record, noprior: Record, stop_delay: Record) -> str:
    """Each constant at half and double its default, with the prior and without it."""
    without = variants(noprior)
    rows = []
    for name, (half, double) in {**variants(prior), **variants(stop_delay)}.items():
        label = f"{CONSTANTS.get(name, f'`{name}`')} ({half['value'] * 2})"
        if name == "prior_error":  # it scales the prior's gain: nothing to scale without one
            alone = ["(unused)"] * 2
        elif name in without:
            alone = [worst_best(r) for r in without[name]]
        else:
            alone = ["(not run)"] * 2
        rows.append([label, worst_best(half), worst_best(double), *alone])
    header = ["constant (default)", "half: worst / best", "double: worst / best"]
    header += ["no prior: half", "no prior: double"]
    return markdown(header, "lrrrr", rows)


# --- real vLLM in process (benchmarks/vllm/) ----------------------------------------------


def paired_ratios(row: Record, base: Record) -> list[float]:
    """Run i of a policy over run i of the baseline, which ran just before it in the same
    repetition: on a noisy machine a steadier reading than the ratio of medians."""
    return [a / b for a, b in zip(row["output_tok_s_runs"], base["output_tok_s_runs"])]


def _vs_vllm(row: Record, base: Record) -> str:
    """A policy's ratio of medians over vLLM's scheduler, with its paired ratios: median and
    range."""
    pairs = paired_ratios(row, base)
    ratio = row["output_tok_s"] / base["output_tok_s"]
    return f"{ratio:.2f}x ({statistics.median(pairs):.2f}, {min(pairs):.2f}-{max(pairs):.2f})"


@table("vllm-tiny-llama", "benchmarks/vllm/bench.json", "benchmarks/vllm/bench-async.json")
def vllm_tiny_llama(sync: Record, asynchronous: Record) -> str:
    """Each policy over vLLM's own scheduler on both loops, and its STOPs (sync)."""
    rows = []
    loops = by_workload(sync["rows"]), by_workload(asynchronous["rows"])
    for workload, runs in loops[0].items():
        for policy, row in runs.items():
            if policy == "vllm":
                continue
            other = loops[1][workload]
            decisions = f"{row.get('policy_stops', 0)} / {row.get('policy_decisions', 0)}"
            rows.append(
                [
                    workload,
                    policy,
                    _vs_vllm(row, runs["vllm"]),
                    _vs_vllm(other[policy], other["vllm"]),
                    decisions,
                ]
            )
    header = [
        "workload",
        "policy",
        "sync: vs vLLM (paired, range)",
        "async: vs vLLM (paired, range)",
        "STOPs / decisions (sync)",
    ]
    return markdown(header, "llrrr", rows)


@table("paper-policies-sglang", "benchmarks/paper-policies/sglang.json")
def paper_policies_sglang(record: Record) -> str:
    """The authors' policies and Feather in SGLang's loop: medians, the runs, batch shape."""
    rows = []
    for workload, runs in by_workload(record["rows"]).items():
        for policy, r in runs.items():
            each = ", ".join(n0(x) for x in r["output_tok_s_runs"])
            rows.append(
                [
                    r.get("scenario", workload),
                    policy,
                    f"{n0(r['output_tok_s'])} ({each})",
                    f"{r['vs_fcfs']:.2f}x",
                    f"{r['mean_batch']:.1f}",
                    f"{r['mean_prefix_groups']:.2f}",
                    str(r["preemptions"]),
                    f"{r['ttft_p50_s']:.2f} / {r['ttft_p99_s']:.2f}",
                ]
            )
    header = ["scenario", "policy", "out tok/s median (runs)", "vs fcfs", "mean batch"]
    header += ["groups/batch", "retractions", "TTFT p50 / p99 s"]
    return markdown(header, "llrrrrrr", rows)


# --- prefix detection cost: CHT against a radix pass (benchmarks/cht/) --------------------


def cht_index(record: Record, chunk: int) -> str:
    """One chunk size of `feather index-bench`: cost per decision, arrival, finish, bytes."""
    rows = [index_cells(r) for r in record["rows"] if r["chunk_size"] == chunk]
    return markdown(list(INDEX_COLUMNS), "r" * len(INDEX_COLUMNS), rows)


@table("cht-index-chunk16", "benchmarks/cht/index.json")
def cht_index_chunk16(record: Record) -> str:
    return cht_index(record, 16)


@table("cht-index-chunk64", "benchmarks/cht/index.json")
def cht_index_chunk64(record: Record) -> str:
    return cht_index(record, 64)


@table("cht-index-chunk512", "benchmarks/cht/index.json")
def cht_index_chunk512(record: Record) -> str:
    return cht_index(record, 512)


@table("cht-memory", "benchmarks/cht/memory.json")
def cht_memory(record: Record) -> str:
    """The index's allocation with 100,000 long prompts waiting, shared or not."""
    rows = [
        [
            str(r["chunk_size"]),
            r["sharing"],
            f"{r['chunks_per_request']:,}",
            f"{r['digest_bytes_per_request']:,}",
            n0(r["bytes_per_request"]),
            f"{r['total_gib']:.2f} GiB",
        ]
        for r in record["rows"]
    ]
    header = ["chunk", "sharing", "chunks/request", "raw digest bytes", "bytes/request"]
    header += [f"total for {record['rows'][0]['requests']:,}"]
    return markdown(header, "rlrrrr", rows)


# --- `feather replay` against `vllm bench serve` (benchmarks/replay/) ---------------------

CLIENT_FIELDS = {
    "output_throughput": ("output_throughput (tok/s)", ",.1f"),
    "request_throughput": ("request_throughput (req/s)", ",.1f"),
    "mean_ttft_ms": ("mean_ttft_ms", ",.1f"),
    "median_ttft_ms": ("median_ttft_ms", ",.1f"),
    "p99_ttft_ms": ("p99_ttft_ms", ",.1f"),
    "mean_tpot_ms": ("mean_tpot_ms", ",.1f"),
    "client_process_cpu_s": ("client process CPU s (imports included)", ".2f"),
}
"""vLLM's fields as the client check's table names and prints them."""


@table("replay-vllm-client-check", "benchmarks/replay/vllm-client-check.json")
def replay_vllm_client_check(record: Record) -> str:
    """Each of vLLM's fields, median over the runs, for both clients and their ratio."""
    replay, vllm = record["medians"]["feather replay"], record["medians"]["vllm bench serve"]
    ratios = record["ratio_replay_over_vllm"]
    rows = [
        [label, format(replay[f], spec), format(vllm[f], spec), f"{ratios[f]:.3f}"]
        for f, (label, spec) in CLIENT_FIELDS.items()
    ]
    runs = record["config"]["repeats"]
    header = [f"field (median of {runs})", "feather replay", "vllm bench serve", "replay / vLLM"]
    return markdown(header, "lrrr", rows)
