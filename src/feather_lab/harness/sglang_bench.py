"""CPU cost of one scheduling pass in SGLang's own classes: lpm / dfs-weight vs Feather.

`feather sglang-bench` (the SGLang venv; see the 'sglang' extra in pyproject.toml). N waiting
requests, each one of `PREFIXES` shared prefixes (held by SGLang's `RadixCache`) plus a private
suffix, optionally beside a running batch (`--running`). Measured on process CPU time:
`calc_priority` of SGLang's policies (lpm also with its fallback above 128 waiting disabled),
Feather's ordering pass (`HostStats.ordering_s`), and the whole batch formation (calc_priority
+ SGLang's PrefillAdder loop) in interleaved lpm / Feather pairs; per N the median over runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from feather_lab.bench.record import write_record
from feather_sched.sglang.cpu import prepare_cpu_import
from feather_sched.sglang.plugin import settings_from_env

PREFIXES = 100
PREFIX_LEN = 1500
PROMPT_LEN = 2000
KV_TOKENS = 1_000_000
MAX_PREFILL_TOKENS = 16384
CHUNKED_PREFILL_SIZE = 8192
MAX_RUNNING = 1024
"""The default batch limit (`--max-running`)."""


def prefix_pool(rng: random.Random) -> list[array]:
    """The workload's shared prefixes: `PREFIXES` random prompts of `PREFIX_LEN` tokens."""
    return [
        array("q", (rng.randrange(1, 32000) for _ in range(PREFIX_LEN))) for _ in range(PREFIXES)
    ]


def prompt(rng: random.Random, prefixes: list[array]) -> array:
    """One request's prompt: a prefix drawn at random, then a private suffix up to
    `PROMPT_LEN` tokens."""
    ids = array("q", prefixes[rng.randrange(len(prefixes))])
    ids.extend(rng.randrange(1, 32000) for _ in range(PROMPT_LEN - PREFIX_LEN))
    return ids


class Setup:
    """SGLang imported and its config published once; fresh caches and policies per run."""

    def __init__(self, seed: int) -> None:
        prepare_cpu_import()
        import torch
        from sglang.srt.managers import schedule_policy as sp
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs

        reset_context()
        publish(
            ServerArgs(model_path="dummy", device="cpu"),
            role="test",
            ranks=SpawnRanks(world_rank=0, dp_rank=None),
        )
        torch.set_num_threads(1)
        self.torch, self.sp, self.Req, self.ScheduleBatch = torch, sp, Req, ScheduleBatch
        self.Alloc, self.RadixCache, self.RadixKey = TokenToKVPoolAllocator, RadixCache, RadixKey
        self.InsertParams, self.MatchPrefixParams = InsertParams, MatchPrefixParams
        self.SamplingParams = SamplingParams
        self.feather_policy = os.environ.get("FEATHER_POLICY") or "grouped"
        self.max_running = MAX_RUNNING
        """The batch's request limit (SGLang's `max_running_requests`)."""
        self._kept: Any = None
        self.rng = random.Random(seed)
        self.prefixes = prefix_pool(self.rng)

    def tree(self):
        """A RadixCache over a CPU token pool, holding the shared prefixes."""
        alloc = self.Alloc(KV_TOKENS, self.torch.float16, "cpu", None, False)
        tree = self.RadixCache.create_simulated(mock_allocator=alloc)
        for p in self.prefixes:
            key = self.RadixKey(token_ids=p)
            tree.insert(self.InsertParams(key=key, value=alloc.alloc(len(p))))
        return tree, alloc

    def keep_policy(self, queue: Any) -> None:
        """One Feather policy for every formation, as a server keeps one for its life, so
        its caches are warm (the grouping judge's locality ratios, the prior's plan gains);
        each formation still gets a fresh CHT."""
        if self._kept is None or queue.policy.name != self._kept.name:
            self._kept = queue.policy
        else:
            queue.policy = self._kept

    def requests(self, n: int, tag: str) -> list:
        """`n` requests of the workload's shape, ids `tag` + their number."""
        return [
            self.Req(
                f"{tag}{i}",
                "",
                prompt(self.rng, self.prefixes),
                self.SamplingParams(max_new_tokens=128),
            )
            for i in range(n)
        ]

    def policy(self, name: str, tree, feather: bool = False):
        """A SchedulePolicy with Feather on or off (the plugin reads FEATHER_POLICY when a
        SchedulePolicy is built)."""
        os.environ["FEATHER_POLICY"] = self.feather_policy if feather else "off"
        return self.sp.SchedulePolicy(name, tree, False, False, False)

    def batch_formation(self, policy, tree, alloc, queue: list, running: Sequence = ()) -> int:
        """scheduler.py `_get_new_batch_prefill_raw`: calc_priority, then the adder loop,
        beside a running batch of `running` (its requests' output reserves bind the adder,
        and a policy that weighs the batch, as `feather`'s does, reads it)."""
        from sglang.srt.managers.scheduler import Scheduler

        running = self.ScheduleBatch(reqs=list(running))
        policy.calc_priority(queue, running, processed_tokens=0)
        host = _Host(policy, self.max_running)
        adder = Scheduler.get_prefill_adder_class(host)(
            1, tree, alloc, running, 0.5, MAX_PREFILL_TOKENS, CHUNKED_PREFILL_SIZE, 0, 0,
            max_running_requests=host.max_running_requests,
        )  # fmt: skip
        for req in queue:
            req.init_next_round_input(tree)
            res = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
            if res != self.sp.AddReqResult.CONTINUE:
                break
        return len(adder.can_run_list)

    def match(self, tree, reqs: list) -> None:
        for r in reqs:
            tree.match_prefix(
                self.MatchPrefixParams(key=self.RadixKey(token_ids=r.origin_input_ids))
            )

    def insert(self, tree, reqs: list) -> None:
        for r in reqs:
            ids = r.origin_input_ids
            value = self.torch.empty(len(ids), dtype=self.torch.int64)  # its KV slot indices
            tree.insert(self.InsertParams(key=self.RadixKey(token_ids=ids), value=value))


class _Host:
    """What `Scheduler.get_prefill_adder_class` reads off the scheduler, and what Feather's
    wrapper of it reads too: the prefill budget the adder is built with (a server's
    Scheduler has both attributes; with them Feather's grouping judge walks the queue head
    up to the batch's free slots each pass, `policies/order.py`). `enable_overlap` is left
    unset, which Feather reads as a GPU server's overlap loop."""

    def __init__(self, policy: Any, max_running_requests: int) -> None:
        self.policy = policy
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = MAX_PREFILL_TOKENS
        self.chunked_prefill_size = CHUNKED_PREFILL_SIZE


def _cpu(fn, *args) -> float:
    """CPU seconds of fn(*args) in this process."""
    gc.collect()
    t0 = time.process_time()
    fn(*args)
    return time.process_time() - t0


def _passes(policy, queue: list, passes: int) -> None:
    for _ in range(passes):
        policy.calc_priority(queue, None)


def _calc(policy, queue: list) -> None:
    policy.calc_priority(queue, None)


def _lpm_matching(s: Setup, policy, queue: list) -> None:
    saved = s.sp.WAITING_QUEUE_PREFIX_MATCH_MAX
    s.sp.WAITING_QUEUE_PREFIX_MATCH_MAX = 1 << 62  # lpm's matching at any queue length
    try:
        policy.calc_priority(queue, None)
    finally:
        s.sp.WAITING_QUEUE_PREFIX_MATCH_MAX = saved


def measure(
    s: Setup,
    n: int,
    repeats: int,
    passes: int,
    formations: int = 10,
    running: int = 0,
    finished: int = 0,
) -> dict:
    """`repeats` rounds of every measurement at `n` waiting (each with `formations` pairs of
    batch formations, beside a batch of `running` requests; Feather's CHT last saw `finished`
    more running, which have left the batch since); medians (and minima of times), and
    Feather's ordering pass against SGLang's own priority passes."""
    reqs = s.requests(n, f"n{n}-")
    run = s.requests(running, f"n{n}-running-")
    gone = s.requests(finished, f"n{n}-finished-")
    rows: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rows.setdefault(key, []).append(value)

    for _ in range(repeats):
        _measure_sglang(s, reqs, passes, add)
        _measure_feather(s, reqs, run, passes, add, gone)
        _measure_formations(s, reqs, run, formations, add, gone)
        # the radix tree's own per-request costs (SGLang matches and inserts every request)
        tree, _ = s.tree()
        sample = reqs[: min(n, 500)]
        add("radix_match_per_request_us", _cpu(s.match, tree, sample) / len(sample) * 1e6)
        add("radix_insert_per_request_us", _cpu(s.insert, tree, sample) / len(sample) * 1e6)

    out: dict[str, Any] = {"n_waiting": n}
    for key, values in rows.items():
        out[key] = statistics.median(values)
        if key.endswith(("_ms", "_us")):
            out[f"{key}_min"] = min(values)
    for stat in ("", "_min"):
        feather = out[f"feather_ordering_pass_ms{stat}"]
        for name in ("lpm_matching", "lpm", "dfs-weight"):
            ratio = out[f"{name}_calc_priority_ms{stat}"] / feather
            out[f"speedup_vs_{name.replace('-', '_')}{stat}"] = ratio
    return out


def _measure_sglang(s: Setup, reqs, passes: int, add: Callable[[str, float], None]) -> None:
    """SGLang's own calc_priority, each on a fresh tree holding the prefixes."""
    for name in ("fcfs", "lpm"):
        tree, _ = s.tree()
        cpu = _cpu(_passes, s.policy(name, tree), list(reqs), passes)
        add(f"{name}_calc_priority_ms", cpu / passes * 1e3)
    tree, _ = s.tree()
    cpu = _cpu(_calc, s.policy("dfs-weight", tree), list(reqs))
    add("dfs-weight_calc_priority_ms", cpu * 1e3)
    tree, _ = s.tree()
    cpu = _cpu(_lpm_matching, s, s.policy("lpm", tree), list(reqs))
    add("lpm_matching_calc_priority_ms", cpu * 1e3)


def _measure_formations(
    s: Setup,
    reqs,
    running: list,
    pairs: int,
    add: Callable[[str, float], None],
    gone: Sequence = (),
) -> None:
    """`pairs` batch formations each of lpm as shipped and of Feather, interleaved (which goes
    first alternates), each on a fresh tree; Feather's added CPU is the median of the
    pairs' differences. Feather runs as it does in a server, untimed (its queue's `timer`
    unset), so the formation's CPU is the code's own, not the ordering pass's measurement."""
    for k in range(pairs):
        times: dict[str, float] = {}
        for name in ("feather", "lpm") if k % 2 else ("lpm", "feather"):
            tree, alloc = s.tree()
            policy, queue = _formation_policy(s, name, tree, reqs, running=running, gone=gone)
            gc.collect()
            t0 = time.process_time()
            admitted = s.batch_formation(policy, tree, alloc, queue, running)
            times[name] = (time.process_time() - t0) * 1e3
            add(f"{name}_batch_formation_ms", times[name])
            add(f"{name}_admitted", admitted)
        add("feather_added_ms", times["feather"] - times["lpm"])


def _formation_policy(
    s: Setup,
    name: str,
    tree,
    reqs,
    refresh: bool = False,
    running: Sequence = (),
    gone: Sequence = (),
) -> tuple[Any, list]:
    """lpm as shipped, or Feather with its CHT holding the queue and the running batch and its
    adder class built (as a server has them by its second batch), each after one untimed
    pass over the same queue and batch (a server's previous pass: what it reads off the
    queue head, such as the grouping judge's request views, a server has already read) and
    about to run a pass without SGLang's LRU refresh (`common_pass`) unless `refresh`.

    Both arms do the same untimed work first: Feather's CHT is filled from the queue (every
    prompt hashed), and lpm's arm fills one it then drops. That work sweeps the CPU caches,
    so done for Feather's arm alone it would leave only Feather's formation running on
    colder caches."""
    from feather_sched.sglang.plugin import queue_for

    queue = list(reqs)
    policy = s.policy("fcfs", tree, feather=True)
    # both arms (sync only reads SGLang's lists); `gone` ran then, and finishes before the pass
    queue_for(policy).sync(queue, [*running, *gone])
    if name == "lpm":
        policy = s.policy("lpm", tree)  # Feather's CHT dropped with its policy
    else:
        _warm_adder_class(s, policy)
        s.keep_policy(queue_for(policy))
    policy.calc_priority(queue, s.ScheduleBatch(reqs=[*running, *gone]))  # the previous pass
    return common_pass(policy, refresh), queue


def common_pass(policy: Any, refresh: bool = False) -> Any:
    """`policy` (a SchedulePolicy) set to run a pass as 31 in 32 of a server's are:
    without the LRU refresh of the first 128 waiting prefixes, which SGLang's fcfs-family
    passes run every 32nd call (`_touch_waiting_prefixes`, WAITING_PREFIX_REFRESH_INTERVAL)
    and Feather's as well; a fresh policy's first pass refreshes, which would dominate a
    single formation. Its amortized cost is in `calc_priority`'s mean over `--passes` calls.
    `refresh`: set to run the every-32nd pass, the one that refreshes."""
    if hasattr(policy, "_waiting_prefix_refresh_calls"):
        policy._waiting_prefix_refresh_calls = 0 if refresh else 1
    return policy


def _measure_feather(s: Setup, reqs, running: list, passes: int, add, gone: Sequence = ()) -> None:
    """Feather: the CHT filled as arrivals fill it (the running batch's too, and `gone`, which
    finish before the formation), then one batch formation; and its ordering pass alone."""
    from feather_sched.sglang.plugin import queue_for

    tree, alloc = s.tree()
    policy, queue = s.policy("fcfs", tree, feather=True), list(reqs)
    fq = queue_for(policy)
    hashed = len(reqs) + len(running) + len(gone)
    add("feather_hash_per_request_us", _cpu(fq.sync, queue, [*running, *gone]) / hashed * 1e6)
    _warm_adder_class(s, policy)
    s.keep_policy(fq)
    fq.timer = time.process_time  # CPU time, like the SGLang figures
    fq.stats.ordering_s = 0.0
    s.batch_formation(policy, tree, alloc, queue, running)
    add("feather_ordering_pass_ms", fq.stats.ordering_s * 1e3)
    tree, _ = s.tree()
    policy, queue = s.policy("fcfs", tree, feather=True), list(reqs)
    queue_for(policy).sync(queue, running)
    add("feather_calc_priority_ms", _cpu(_passes, policy, queue, passes) / passes * 1e3)


def _warm_adder_class(s: Setup, policy) -> None:
    """Build Feather's adder subclass before the timed formation, as a server has long done
    by its second batch (`feather_adder_class` builds it once per queue)."""
    from sglang.srt.managers.scheduler import Scheduler

    Scheduler.get_prefill_adder_class(_Host(policy, s.max_running))


def _check_policy(ap: argparse.ArgumentParser, name: str | None) -> None:
    """Exit 2 before any work on a policy name the registry does not know."""
    from feather_sched.policies.registry import policy_names

    if name is not None and name not in policy_names():
        ap.error(f"--policy {name!r}: no such policy; valid: {', '.join(policy_names())}")


def _arguments(argv: list[str] | None) -> tuple[argparse.Namespace, list[int]]:
    """The command line, checked (exit 2 with the value and what is valid), and the sizes."""
    ap = argparse.ArgumentParser(prog="feather sglang-bench", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128,1000,10000", help="waiting-queue lengths")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--passes", type=int, default=32, help="calc_priority calls to average")
    ap.add_argument(
        "--formations", type=int, default=10, help="lpm/Feather formation pairs per repeat"
    )
    ap.add_argument(
        "--running",
        type=int,
        default=0,
        help="requests in the running batch beside each formation (the workload's shape)",
    )
    ap.add_argument(
        "--finished",
        type=int,
        default=0,
        help="requests of the running batch Feather last saw that have finished by each "
        "formation (a server's usual pass: its batch changed since the last one)",
    )
    ap.add_argument(
        "--max-running",
        type=int,
        default=MAX_RUNNING,
        help="SGLang's max_running_requests: the batch's request limit",
    )
    ap.add_argument(
        "--policy",
        default=None,
        help="Feather's policy (default: FEATHER_POLICY, else grouped)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    _check_policy(ap, args.policy)
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    for name, value in (
        ("--repeats", args.repeats),
        ("--passes", args.passes),
        ("--formations", args.formations),
        ("--max-running", args.max_running),
        *(("--sizes", n) for n in sizes),
    ):
        if value < 1:
            ap.error(f"{name} must be >= 1, got {value}")
    if not 0 <= args.running < args.max_running:
        ap.error(f"--running must be >= 0 and below --max-running, got {args.running}")
    if args.finished < 0:
        ap.error(f"--finished must be >= 0, got {args.finished}")
    return args, sizes


def main(argv: list[str] | None = None) -> int:
    args, sizes = _arguments(argv)
    s = Setup(args.seed)
    s.max_running = args.max_running
    if args.policy is not None:
        s.feather_policy = args.policy
    os.environ["FEATHER_POLICY"] = s.feather_policy  # the plugin registers its hooks when on
    from sglang.srt.plugins import load_plugins

    load_plugins()
    import sglang

    results = []
    for n in sizes:
        row = measure(s, n, args.repeats, args.passes, args.formations, args.running, args.finished)
        results.append(row)
        short = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
        print(json.dumps(short), flush=True)
    record = {
        "benchmark": "sglang scheduling pass",
        "command": "feather sglang-bench " + " ".join(argv or sys.argv[1:]),
        "sglang": sglang.__version__,
        "feather_policy": s.feather_policy,
        "feather_policy_options": dict(settings_from_env().policy_options),
        "feather_chunk_tokens": settings_from_env().chunk_tokens,
        "workload": {"prefixes": PREFIXES, "prefix_len": PREFIX_LEN, "prompt_len": PROMPT_LEN},
        "adder": {"max_prefill_tokens": MAX_PREFILL_TOKENS, "kv_tokens": KV_TOKENS},
        "repeats": args.repeats,
        "passes": args.passes,
        "formations": args.formations,
        "running": args.running,
        "finished": args.finished,
        "max_running": args.max_running,
        "results": results,
    }
    if args.json:
        write_record(args.json, **record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
