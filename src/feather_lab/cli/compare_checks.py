"""What `feather compare` checks before it prints a ratio: that the two records share a
(workload, policy) pair, and whether they ran the same setup (engine, hardware, model,
kernel): B/A across two setups measures the setups as much as the change."""

from __future__ import annotations

from typing import Any

REAL_ENGINES = ("vllm", "sglang")
REAL_ENGINE_MODEL = "tiny-llama"
"""The model a real-engine record ran when its config says none (the bench's default)."""


def common_pairs(a: dict[str, Any], b: dict[str, Any], name_a: str, name_b: str) -> int:
    """How many rows of B have a counterpart in A (`results.compare_rows`: same workload and
    name); a ValueError naming what each record holds when none."""
    from feather_lab.bench.results import compare_rows

    both = len(compare_rows(a["rows"], b["rows"]))
    if not both:
        raise ValueError(
            f"no (workload, policy) pair in common between {name_a} ({_held(a)}) and "
            f"{name_b} ({_held(b)}); compare records of the same workloads and policies"
        )
    return both


def _held(record: dict[str, Any]) -> str:
    from feather_lab.bench.rows import as_rows

    rows = as_rows(record["rows"])
    if not rows:
        return "no rows"
    workloads = ", ".join(sorted({r.workload for r in rows}))
    return f"workloads {workloads}; policies {', '.join(sorted({r.name for r in rows}))}"


def setup(record: dict[str, Any]) -> dict[str, str]:
    """A record's setup as it says it: engine, hardware (a real engine's: the machine's
    CPU), model and kernel; a field the record does not give is left out."""
    cfg = record.get("config") or {}
    engine = cfg.get("engine_kind") or cfg.get("engine")
    engine = engine if isinstance(engine, str) else ("sim" if "hardware" in cfg else None)
    hardware = cfg.get("hardware")
    model = cfg.get("model")
    if engine in REAL_ENGINES:
        hardware = hardware or (record.get("machine") or {}).get("cpu")
        model = model or REAL_ENGINE_MODEL
    found = {"engine": engine, "hardware": hardware, "model": model, "kernel": cfg.get("kernel")}
    return {k: str(v) for k, v in found.items() if v is not None}


def setup_warning(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """One line when the two records ran different setups (None when they agree)."""
    sa, sb = setup(a), setup(b)
    differ = [f"{k} ({sa[k]} vs {sb[k]})" for k in sa if k in sb and sa[k] != sb[k]]
    if not differ:
        return None
    return (
        f"warning: A and B differ in {', '.join(differ)}: B/A measures that difference too, "
        "not only the change under test"
    )
