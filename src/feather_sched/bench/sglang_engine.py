"""SGLang's real `Scheduler` on CPU, with a stand-in model forward: the harness behind the
`sglang` scheduler-loop tests and `feather bench --engine sglang`.

What is SGLang's own: everything a server's scheduler process runs. `Scheduler(server_args,
port_args)` is constructed as `run_scheduler_process` constructs it (plugins loaded first by
`sglang.srt.plugins.load_plugins`, so `SGLANG_PLUGINS`/`FEATHER_POLICY` decide whether
Feather is on, exactly as on a server), with its `TpModelWorker`, `ModelRunner`, KV pools,
radix cache, schedule policy, chunked prefill and retraction; then `run_event_loop()` runs its
normal event loop until a `ShutdownReq`. Requests go in as `TokenizedGenerateReqInput` over
the scheduler's own ZMQ input socket and come back as `BatchTokenIDOutput` on the tokenizer's
socket (`skip_tokenizer_init`, the path SGLang uses when no detokenizer runs); aborts are
`AbortReq`s and the cache is flushed between runs with `FlushCacheReqInput`, as the HTTP
server would send them.

What is not SGLang's: the model. The config written at run time names the architecture
`FeatherStandInForCausalLM`, registered in SGLang's `ModelRegistry` (the registry SGLang's
external-model packages use) and loaded with `--load-format dummy`, so there is no download and
no weights. Its forward returns logits that make the next token a deterministic function of
the last token and its position (never EOS), and, when a step-cost profile is given, sleeps
for the time the calibrated CPU cost model (`cost/`) gives that batch: its real shape
(prefill tokens, attention pairs, and the KV slots every sequence reads, read from SGLang's
`req_to_token` table, so radix-cache sharing is measured, not assumed). Everything else in a
step's time (batch building, radix matching, the plugin) is real CPU time.

One `Scheduler` per process (SGLang builds its parallel groups once per process:
`init_parallel_runtime() ran twice in this process`), so each `serve()` runs in a fresh
spawned child, as a server's scheduler process is.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from feather_sched.bench.tiny_llama import ENGINE_MODELS, TINY_LLAMA, TinyLlamaSpec
from feather_sched.policies.base import Policy, SchedulerView

STANDIN_ARCH = "FeatherStandInForCausalLM"
EOS_TOKEN = 2
FIRST_TOKEN = 4
"""Generated ids are >= 4 (0-3: pad, bos, eos, unk), so a request never stops early."""
_FORWARD_S = [0.0]
"""Seconds spent inside the stand-in forward in this process (its sleeps included)."""
_PENDING_COST = [0.0]
"""The calibrated cost of the batch SGLang is about to run (set by `_LoopProbe`, from the
`ScheduleBatch`, which holds what a `ForwardBatch` does not: the req_to_token pool)."""


def stand_in_config(model: TinyLlamaSpec) -> dict[str, Any]:
    """The config.json the stand-in is built from: the shape SGLang sizes its KV pool by
    (one of the built-in engine models, bench/tiny_llama.py)."""
    return {
        "architectures": [STANDIN_ARCH],
        "model_type": "llama",
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads,
        "head_dim": model.hidden_size // model.num_heads,
        "max_position_embeddings": model.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": EOS_TOKEN,
        "pad_token_id": 0,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
    }


def next_token(last_token: int, position: int, vocab_size: int) -> int:
    """The stand-in's output after `last_token` at `position` (what its logits select)."""
    return (last_token * 31 + position * 7) % (vocab_size - FIRST_TOKEN) + FIRST_TOKEN


@dataclass(frozen=True)
class ServeRequest:
    rid: str
    """Unique, and no rid a prefix of another: SGLang's `abort_request` matches by prefix
    (`req.rid.startswith(abort.rid)`)."""
    prompt: Sequence[int]
    output_len: int
    arrival_s: float = 0.0
    group: str | None = None
    abort_after_tokens: int | None = None
    """Send an `AbortReq` once this many output tokens were seen (0: right after sending)."""


@dataclass
class ServeSpec:
    """One scheduler process: its SGLang settings, Feather's, and the runs it serves."""

    runs: list[list[ServeRequest]]
    """Served one after the other on the same scheduler; the radix cache is flushed
    (`FlushCacheReqInput`) between runs."""
    feather_policy: str | None = None
    """FEATHER_POLICY with SGLANG_PLUGINS=feather; None: the plugin is not named (off)."""
    schedule_policy: str = "fcfs"
    """SGLang's own `--schedule-policy` (under Feather too: Feather orders on top of it)."""
    policy_options: dict[str, Any] = field(default_factory=dict)
    policy_state: str | None = None
    state_every_s: float | None = None
    chunk_tokens: int | None = None
    extra_policies: dict[str, str] = field(default_factory=dict)
    """Policies to register by name ("module:Class") before the plugin loads."""
    model: TinyLlamaSpec = TINY_LLAMA
    max_total_tokens: int = 8192
    max_running_requests: int = 64
    chunked_prefill_size: int = 512
    max_prefill_tokens: int = 4096
    page_size: int = 1
    overlap: bool = False
    """SGLang's overlap event loop (`event_loop_overlap`) instead of `event_loop_normal`."""
    step_cost: tuple[str, str] | None = None
    """(hardware profile, model profile) the stand-in forward sleeps by; None: no sleep."""
    run_timeout_s: float = 120.0
    seed: int = 0
    env: dict[str, str] = field(default_factory=dict)
    """More environment for the scheduler process (SGLang's own `SGLANG_*` switches)."""
    log_level: str = "ERROR"
    """Level of SGLang's loggers in the scheduler process (its retraction notices are
    WARNINGs; the report counts retractions either way)."""


# ---------------------------------------------------------------------------- parent side
def serve(spec: ServeSpec, timeout_s: float | None = None) -> dict[str, Any]:
    """Run `spec` in a fresh scheduler process; its report (see `_child_main`)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_entry, args=(spec, child), daemon=True)
    proc.start()
    child.close()
    limit = timeout_s or (120.0 + spec.run_timeout_s * len(spec.runs))
    try:
        if not parent.poll(limit):
            raise RuntimeError(f"SGLang scheduler process gave no report within {limit:.0f}s")
        report = parent.recv()
    except EOFError:
        raise RuntimeError(
            f"SGLang scheduler process died without a report (exit code {proc.exitcode})"
        ) from None
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if "error" in report:
        raise RuntimeError(f"SGLang scheduler process failed:\n{report['error']}")
    report["exitcode"] = proc.exitcode
    return report


def _child_entry(spec: ServeSpec, conn) -> None:
    try:
        report = _child_main(spec)
    except BaseException:
        report = {"error": traceback.format_exc()}
    conn.send(report)
    conn.close()
    logging.shutdown()


# ---------------------------------------------------------------------------- child side
def _child_main(spec: ServeSpec) -> dict[str, Any]:
    t_start = time.perf_counter()
    env = {"SGLANG_PLUGINS": "feather"} if spec.feather_policy is not None else {}
    if spec.feather_policy is not None:
        env["FEATHER_POLICY"] = spec.feather_policy
        env["FEATHER_POLICY_OPTIONS"] = json.dumps(spec.policy_options)
        if spec.policy_state:
            env["FEATHER_POLICY_STATE"] = spec.policy_state
        if spec.state_every_s is not None:
            env["FEATHER_POLICY_STATE_EVERY_S"] = str(spec.state_every_s)
        if spec.chunk_tokens:
            env["FEATHER_CHUNK_TOKENS"] = str(spec.chunk_tokens)
    else:
        os.environ.pop("SGLANG_PLUGINS", None)
        os.environ.pop("FEATHER_POLICY", None)
    os.environ.update(env)
    os.environ.update(spec.env)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from feather_sched.integrations.sglang_cpu import prepare_cpu_import
    from feather_sched.policies.registry import register_policy

    for name, target in spec.extra_policies.items():
        register_policy(name, target)
    prepare_cpu_import()
    from sglang.srt.plugins import load_plugins

    load_plugins()  # what run_scheduler_process does first
    logging.getLogger("sglang").setLevel(spec.log_level)
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.models[STANDIN_ARCH] = _standin_class(spec)
    model_dir = Path(tempfile.mkdtemp(prefix="feather-sglang-"))
    (model_dir / "config.json").write_text(json.dumps(stand_in_config(spec.model)))

    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import PortArgs, ServerArgs

    server_args = ServerArgs(
        model_path=str(model_dir),
        device="cpu",
        load_format="dummy",
        dtype="float32",
        skip_tokenizer_init=True,
        attention_backend="torch_native",
        disable_cuda_graph=True,
        disable_overlap_schedule=not spec.overlap,
        schedule_policy=spec.schedule_policy,
        max_total_tokens=spec.max_total_tokens,
        max_running_requests=spec.max_running_requests,
        chunked_prefill_size=spec.chunked_prefill_size,
        max_prefill_tokens=spec.max_prefill_tokens,
        page_size=spec.page_size,
        mem_fraction_static=0.1,
        random_seed=spec.seed,
        log_level="error",
    )
    port_args = PortArgs.init_new(server_args)
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    t_build = time.perf_counter()
    scheduler = Scheduler(server_args, port_args)
    build_s = time.perf_counter() - t_build

    probe = _LoopProbe(scheduler, spec)
    queue = _feather_queue(scheduler)
    loaded_table = _table(queue)
    client = _Client(spec, port_args, probe)
    thread = threading.Thread(target=client.main, name="feather-client", daemon=True)
    thread.start()
    scheduler.run_event_loop()  # SGLang's loop, until the client's ShutdownReq
    thread.join(60)
    if client.error is not None:
        raise RuntimeError(f"client failed: {client.error}")

    report: dict[str, Any] = {
        "build_s": round(build_s, 3),
        "startup_s": round(t_build - t_start, 3),
        "process_s": round(time.perf_counter() - t_start, 3),
        "runs": client.results,
        "loop": probe.summary(),
        "plugin_hooked": _hooked(scheduler),
        "scheduler_class": f"{type(scheduler).__module__}.{type(scheduler).__qualname__}",
        "event_loop": "overlap" if scheduler.enable_overlap else "normal",
        "max_total_num_tokens": int(getattr(scheduler, "max_total_num_tokens", 0) or 0),
        "feather": None,
    }
    if queue is not None:
        report["feather"] = {
            "policy": queue.policy.name,
            "stats": asdict(queue.stats),
            "cht_waiting": queue.index.num_waiting,
            "cht_running": queue.index.num_running,
            "cht_empty": queue.index.is_empty(),
            "passes": queue.passes,
            "loaded_table": loaded_table,
            "final_table": _table(queue),
            "counters": _counters(queue.policy),
            "state_saves": None if queue.state_saver is None else queue.state_saver.saves,
        }
    return report


def _hooked(scheduler) -> bool:
    """Did SGLang's plugin loader register Feather's hooks (`HookRegistry`) in this process,
    and is SGLang's Scheduler the class they were applied to?"""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from feather_sched.integrations.sglang import HOOK_TARGETS, _around_next_batch

    hooks = [
        (h, getattr(src, "plugin_name", None))
        for target in HOOK_TARGETS
        for _, h, src in HookRegistry._hooks.get(target, ())
    ]
    loaded_by_sglang = all(name == "feather" for _, name in hooks)  # load_plugins' source
    return (
        len(hooks) == len(HOOK_TARGETS)
        and loaded_by_sglang
        and (_around_next_batch in [h for h, _ in hooks])
    )


def _feather_queue(scheduler):
    from feather_sched.integrations.sglang import queue_for

    try:
        return queue_for(scheduler.policy)
    except Exception:
        return None


def _table(queue) -> Any:
    table = getattr(getattr(queue, "policy", None), "table", None)
    return None if table is None else json.loads(json.dumps(table.to_dict()))


def _counters(policy: Policy) -> dict[str, int]:
    from feather_sched.policies.base import policy_counters

    return policy_counters(policy)


def _standin_class(spec: ServeSpec) -> type:
    """The stand-in model class (built here: it subclasses torch's Module and returns SGLang's
    `LogitsProcessorOutput`, both imported only in the scheduler process)."""
    import torch
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from torch import nn

    class FeatherStandInForCausalLM(nn.Module):
        """Deterministic next tokens, at the calibrated CPU cost of the batch it is given."""

        def __init__(self, config, quant_config=None, prefix: str = "") -> None:
            super().__init__()
            self.config = config
            self.vocab = int(config.vocab_size)
            self.anchor = nn.Parameter(torch.zeros(1))  # the dummy loader fills something

        @torch.no_grad()
        def forward(self, input_ids, positions, forward_batch, *args, **kwargs):
            t0 = time.perf_counter()
            if forward_batch.forward_mode.is_extend():
                last = torch.cumsum(forward_batch.extend_seq_lens, 0) - 1
                ids, pos = input_ids[last], positions[last]
            else:
                ids, pos = input_ids, positions
            nxt = (ids.long() * 31 + pos.long() * 7) % (self.vocab - FIRST_TOKEN) + FIRST_TOKEN
            logits = torch.full((len(nxt), self.vocab), -1e4, dtype=torch.float32)
            logits[torch.arange(len(nxt)), nxt] = 0.0
            cost, _PENDING_COST[0] = _PENDING_COST[0], 0.0
            wait = cost - (time.perf_counter() - t0)
            if wait > 0:
                time.sleep(wait)
            _FORWARD_S[0] += time.perf_counter() - t0
            return LogitsProcessorOutput(next_token_logits=logits)

        def load_weights(self, weights) -> None:
            for _ in weights:
                pass

    return FeatherStandInForCausalLM


def _step_cost(spec: ServeSpec) -> Callable[[Any], float] | None:
    """Seconds a `ScheduleBatch` would take by the calibrated cost model (None: no cost).

    Its shape is read off SGLang's own state: prefill tokens and attention pairs from the
    batch's extend/prefix lengths, and the KV every sequence reads from the `req_to_token`
    rows of its context, so tokens the radix cache shares between sequences are counted
    once in `unique_kv_tokens` (page size 1: a slot is a token)."""
    if spec.step_cost is None:
        return None
    import numpy as np

    from feather_sched.cost import BatchShape, StepCostModel

    hardware, model = spec.step_cost
    cost_model = StepCostModel(hardware, model)

    def cost(batch) -> float:
        reqs = batch.reqs
        if not reqs:
            return 0.0
        extend = batch.forward_mode.is_extend()
        if extend:
            ext = np.asarray(batch.extend_lens, dtype=np.int64)
            pre = np.asarray(batch.prefix_lens, dtype=np.int64)
            lens = ext + pre
        else:  # decode: the context read includes the token being decoded
            lens = np.asarray([len(r.origin_input_ids) + len(r.output_ids) for r in reqs])
        table = batch.req_to_token_pool.req_to_token
        rows = [int(r.kv.req_pool_idx) for r in reqs]
        slots = np.concatenate(
            [table[i, : int(n)].numpy() for i, n in zip(rows, lens, strict=True)]
        )
        _, counts = np.unique(slots, return_counts=True)
        shared = counts >= 2
        prefill_tokens = pairs = prefill_seqs = 0
        if extend:
            prefill_tokens = int(ext.sum())
            pairs = int((ext * pre + ext * (ext + 1) // 2).sum())
            prefill_seqs = len(reqs)
        shape = BatchShape(
            num_decode=len(reqs) - prefill_seqs,
            num_prefill_tokens=prefill_tokens,
            prefill_attn_pairs=pairs,
            logical_kv_tokens=int(lens.sum()),
            unique_kv_tokens=len(counts),
            shared_unique_kv_tokens=int(shared.sum()),
            shared_logical_kv_tokens=int(counts[shared].sum()),
            num_prefill_seqs=prefill_seqs,
        )
        return cost_model.step_time(shape)

    return cost


class _LoopProbe:
    """Watches SGLang's loop from the scheduler's own instance (never changes a decision):
    each batch it runs, each retraction, and the time spent picking the next batch."""

    def __init__(self, scheduler, spec: ServeSpec) -> None:
        self.group = {r.rid: r.group or r.rid for run in spec.runs for r in run}
        self.steps = self.batch = self.groups = self.prefill_tokens = 0
        self.extend_steps = 0
        self.retracted: Counter[str] = Counter()
        self.admitted: Counter[str] = Counter()
        self.pick_s = 0.0
        self.max_running = 0
        self._seen_running: set[str] = set()
        self.cost_of = _step_cost(spec)
        self.costs_s = 0.0
        run_batch = scheduler.run_batch
        pick = scheduler.get_next_batch_to_run
        requeue = scheduler._add_request_to_queue

        def on_run_batch(batch, *args, **kwargs):
            reqs = batch.reqs
            self.steps += 1
            self.batch += len(reqs)
            self.groups += len({self.group.get(r.rid, r.rid) for r in reqs})
            self.max_running = max(self.max_running, len(reqs))
            if batch.forward_mode.is_extend():
                self.extend_steps += 1
                self.prefill_tokens += int(getattr(batch, "extend_num_tokens", 0) or 0)
                for r in reqs:
                    if r.rid not in self._seen_running:
                        self._seen_running.add(r.rid)
                        self.admitted[r.rid] += 1
            if self.cost_of is not None:
                _PENDING_COST[0] = cost = self.cost_of(batch)
                self.costs_s += cost
            return run_batch(batch, *args, **kwargs)

        def on_pick(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return pick(*args, **kwargs)
            finally:
                self.pick_s += time.perf_counter() - t0

        def on_requeue(req, is_retracted: bool = False, *args, **kwargs):
            if is_retracted:
                self.retracted[req.rid] += 1
                self._seen_running.discard(req.rid)  # its next prefill is a re-admission
            return requeue(req, is_retracted, *args, **kwargs)

        scheduler.run_batch = on_run_batch
        scheduler.get_next_batch_to_run = on_pick
        scheduler._add_request_to_queue = on_requeue

    def mark(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "batch": self.batch,
            "groups": self.groups,
            "prefill_tokens": self.prefill_tokens,
            "pick_s": self.pick_s,
            "retractions": self.retracted.total(),
            "stand_in_s": _FORWARD_S[0],
        }

    def summary(self) -> dict[str, Any]:
        return {
            **self.mark(),
            "extend_steps": self.extend_steps,
            "retracted": dict(self.retracted),
            "admitted": dict(self.admitted),
            "max_batch": self.max_running,
        }


class _Client:
    """The tokenizer side of the two ZMQ sockets: sends each run's requests at their
    arrival times (and aborts), collects every output, flushes the cache between runs and
    shuts the scheduler down at the end."""

    def __init__(self, spec: ServeSpec, port_args, probe: _LoopProbe) -> None:
        self.spec = spec
        self.port_args = port_args
        self.probe = probe
        self.results: list[dict[str, Any]] = []
        self.error: str | None = None

    def main(self) -> None:
        import zmq
        from sglang.srt.managers.io_struct import ShutdownReq, sock_send

        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.bind(self.port_args.scheduler_input_ipc_name)
        pull = ctx.socket(zmq.PULL)
        pull.bind(self.port_args.tokenizer_ipc_name)
        try:
            for i, run in enumerate(self.spec.runs):
                if i:
                    self._flush(push, pull)
                self.results.append(self._serve(push, pull, run))
        except BaseException:
            self.error = traceback.format_exc()
        finally:
            sock_send(push, ShutdownReq())
            time.sleep(0.2)
            push.close(linger=1000)
            pull.close(linger=0)
            ctx.term()

    def _flush(self, push, pull) -> None:
        from sglang.srt.managers.io_struct import FlushCacheReqInput, sock_recv, sock_send

        for _ in range(100):
            sock_send(push, FlushCacheReqInput())
            while True:
                out = sock_recv(pull)
                if type(out).__name__ == "FlushCacheReqOutput":
                    break
            if out.success:
                return
            time.sleep(0.05)
        raise RuntimeError("the radix cache could not be flushed between runs")

    def _serve(self, push, pull, run: Sequence[ServeRequest]) -> dict[str, Any]:
        import zmq
        from sglang.srt.managers.io_struct import AbortReq, sock_recv, sock_send

        order = sorted(run, key=lambda r: r.arrival_s)
        by_rid = {r.rid: r for r in order}
        sent: dict[str, float] = {}
        first: dict[str, float] = {}
        finished: dict[str, float] = {}
        tokens: dict[str, int] = {}
        reasons: dict[str, Any] = {}
        finish_msgs: Counter[str] = Counter()
        abort_sent: set[str] = set()
        before = self.probe.mark()
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        deadline = t0 + self.spec.run_timeout_s
        nxt = 0
        while len(finished) < len(order):
            now = time.perf_counter()
            if now > deadline:
                missing = [r for r in by_rid if r not in finished][:5]
                raise TimeoutError(f"run timed out; unfinished: {missing}")
            while nxt < len(order) and order[nxt].arrival_s <= now - t0:
                r = order[nxt]
                sock_send(push, _tokenized(r))
                sent[r.rid] = time.perf_counter()
                nxt += 1
                if r.abort_after_tokens == 0:
                    sock_send(push, AbortReq(rid=r.rid))
                    abort_sent.add(r.rid)
            wait_ms = 50
            if nxt < len(order):
                wait_ms = max(0, min(50, int((t0 + order[nxt].arrival_s - now) * 1000)))
            if not pull.poll(wait_ms):
                continue
            while True:
                try:
                    out = sock_recv(pull, zmq.NOBLOCK)
                except zmq.Again:
                    break
                t = time.perf_counter()
                if type(out).__name__ == "AbortReq":  # aborted while waiting: no tokens
                    if out.rid in by_rid:
                        finish_msgs[out.rid] += 1
                        finished.setdefault(out.rid, t)
                        reasons.setdefault(out.rid, out.finished_reason or {"type": "abort"})
                    continue
                if type(out).__name__ != "BatchTokenIDOutput":
                    continue
                for j, rid in enumerate(out.rids):
                    if rid not in by_rid:
                        continue
                    n = int(out.completion_tokens[j])
                    tokens[rid] = max(tokens.get(rid, 0), n)
                    if n and rid not in first:
                        first[rid] = t
                    reason = out.finished_reasons[j]
                    if reason is not None:
                        finish_msgs[rid] += 1
                        finished.setdefault(rid, t)
                        reasons.setdefault(rid, reason)
                    limit = by_rid[rid].abort_after_tokens
                    if limit and n >= limit and rid not in abort_sent and reason is None:
                        sock_send(push, AbortReq(rid=rid))
                        abort_sent.add(rid)
        # outputs of this run still in flight (a duplicate finish would show here)
        while pull.poll(100):
            out = sock_recv(pull)
            if type(out).__name__ == "AbortReq" and out.rid in by_rid:
                finish_msgs[out.rid] += 1
            elif type(out).__name__ == "BatchTokenIDOutput":
                for j, rid in enumerate(out.rids):
                    if rid in by_rid and out.finished_reasons[j] is not None:
                        finish_msgs[rid] += 1
        after = self.probe.mark()
        return {
            "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - cpu0,
            "requests": {
                rid: {
                    "sent": sent[rid] - t0,
                    "first": None if rid not in first else first[rid] - t0,
                    "finished": finished[rid] - t0,
                    "tokens": tokens.get(rid, 0),
                    "reason": reasons[rid],
                    "finish_messages": finish_msgs[rid],
                    "aborted": rid in abort_sent,
                }
                for rid in by_rid
            },
            "loop": {k: after[k] - before[k] for k in after},
        }


def _tokenized(r: ServeRequest):
    from array import array

    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    # not ignore_eos: SGLang then reserves every output token up front and never retracts;
    # the stand-in never emits EOS, so each request still runs to max_new_tokens
    params = SamplingParams(max_new_tokens=r.output_len, temperature=0.0)
    params.normalize(None)
    req = TokenizedGenerateReqInput(
        rid=r.rid,
        input_text=None,
        input_ids=array("q", [int(t) for t in r.prompt]),
        mm_inputs=None,
        token_type_ids=None,
        input_embeds=None,
        sampling_params=params,
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=True,
    )
    req.wrap_pickle_fields()
    return req


# ---------------------------------------------------------------------------- test policies
class RaisingPolicy(Policy):
    """Fault injection for the loop tests: two candidates, then an exception (SGLang must
    finish the pass in its own order and keep serving)."""

    name = "raising"

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        waiting = list(view.waiting_ids())
        yield from waiting[-2:]
        raise RuntimeError("policy bug")


# ---------------------------------------------------------------------------- the bench
SGLANG_POLICIES = ("fcfs", "lpm", "dfs-weight")
"""SGLang's own `--schedule-policy` names the bench runs with the plugin off (under
`--engine sglang` these names mean SGLang's code, not Feather's reimplementations)."""
BASELINE = "fcfs"
"""SGLang's own FCFS: the baseline of `vs_fcfs`, always run."""
STEP_COST_PROFILES = {
    "tiny-llama": "cpu-vllm-fitted.json",
    "kv-bound": "cpu-kv-bound-fitted.json",
}
"""The calibrated CPU hardware profile (benchmarks/) each built-in model's stand-in forward
sleeps by, with the model profile of the same name (`feather calibrate --engine vllm`)."""
BENCH_NOTE = (
    "SGLang's real Scheduler loop (batch building, radix cache, KV pool, chunked prefill, "
    "retraction, the plugin) on CPU; the model forward is a stand-in that sleeps the "
    "calibrated CPU cost of each batch's real shape. It shows what each policy's batches "
    "cost by that model plus the scheduler's own CPU time, with SGLang's memory rules in "
    "charge; it cannot show GPU kernel effects the cost model does not price, nor SGLang's "
    "overlap loop or CUDA graphs. Feather policies run on top of SGLang's fcfs; a Feather "
    "policy keeps its learned state across the runs of one scheduler process."
)


@dataclass(frozen=True)
class SGLangBenchSpec:
    """`feather bench --engine sglang`: the `--engine vllm` workloads and KV scenarios
    (`VllmBenchSpec`'s, blocks of `block_size` tokens -> SGLang's `max_total_tokens`)."""

    workloads: Sequence[str] | None = None
    policies: Sequence[str] = ("fcfs", "lpm", "feather")
    model: str | None = None
    scenarios: Sequence[Any] | None = None
    block_size: int = 32
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096
    repeats: int = 3
    seed: int = 0
    policy_state: Path | None = None
    step_cost: tuple[str, str] | None = None
    """(hardware, model) profile of the stand-in's cost; None: the model's calibrated one."""

    def validate(self) -> None:
        from feather_sched.bench.vllm_engine import ENGINE_SCALES, engine_scale
        from feather_sched.policies.registry import policy_names

        valid = [*SGLANG_POLICIES, *policy_names()]
        bad = [p for p in self.policies if p not in valid]
        if bad:
            raise ValueError(f"unknown policies {bad} for --engine sglang; valid: {valid}")
        if self.model is not None and self.model not in ENGINE_SCALES:
            raise ValueError(
                f"--engine sglang runs a stand-in of a built-in model ({', '.join(ENGINE_SCALES)})"
                f", got {self.model!r}"
            )
        known = engine_scale(self.model).workloads
        unknown = [w for w in self.workloads or () if w not in known]
        if unknown:
            raise ValueError(f"workloads {unknown} unknown; valid: {', '.join(known)}")
        if self.repeats < 1:
            raise ValueError("need repeats >= 1")

    def cost_profiles(self) -> tuple[str, str]:
        if self.step_cost is not None:
            return self.step_cost
        name = self.model or "tiny-llama"
        path = Path(__file__).resolve().parents[3] / "benchmarks" / STEP_COST_PROFILES[name]
        if not path.is_file():
            raise FileNotFoundError(f"calibrated CPU profile {path} not found (a repo checkout)")
        return str(path), name


def _bench_requests(requests, label: str) -> list[ServeRequest]:
    return [
        ServeRequest(
            rid=f"{label}-{i:05d}",
            prompt=[int(t) for t in r.prompt],
            output_len=int(r.output_len),
            arrival_s=float(r.arrival_time),
            group=r.group,
        )
        for i, r in enumerate(sorted(requests, key=lambda r: r.arrival_time))
    ]


def _stand_in_of(model: str | None) -> TinyLlamaSpec:
    return ENGINE_MODELS[model or "tiny-llama"]


def run_sglang_bench(
    spec: SGLangBenchSpec, on_progress: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """One scheduler process per (KV scenario, policy), serving every workload `repeats`
    times (cache flushed between runs); median rows, `vs_fcfs` against SGLang's fcfs."""
    import statistics

    from feather_sched.bench.report import add_relative
    from feather_sched.bench.vllm_engine import engine_scale, engine_workload

    spec.validate()
    tick = on_progress or (lambda _label: None)
    scale = engine_scale(spec.model)
    model = _stand_in_of(spec.model)
    cost = spec.cost_profiles()
    workloads = {
        w: engine_workload(w, model.vocab_size, spec.seed, scale)
        for w in (spec.workloads or scale.default_workloads)
    }
    policies = [BASELINE, *[p for p in spec.policies if p != BASELINE]]
    rows: list[dict[str, Any]] = []
    for scenario in spec.scenarios or scale.scenarios:
        kv_tokens = scenario.num_blocks * spec.block_size
        for pname in policies:
            own = pname in SGLANG_POLICIES
            runs, keys = [], []
            for rep in range(spec.repeats):
                for wname, reqs in workloads.items():
                    label = f"{scenario.name}/{wname}/{pname}/{rep}".replace("/", ".")
                    runs.append(_bench_requests(reqs, label))
                    keys.append(wname)
            state = spec.policy_state if pname == "feather" else None
            serve_spec = ServeSpec(
                runs=runs,
                feather_policy=None if own else pname,
                schedule_policy=pname if own else "fcfs",
                policy_state=None if state is None else str(state),
                model=model,
                max_total_tokens=kv_tokens,
                max_running_requests=spec.max_num_seqs,
                chunked_prefill_size=spec.max_num_batched_tokens,
                max_prefill_tokens=spec.max_num_batched_tokens,
                step_cost=cost,
                run_timeout_s=600.0,
                seed=spec.seed,
            )
            tick(f"{scenario.name}/{pname}: scheduler process, {len(runs)} runs")
            report = serve(serve_spec)
            by_workload: dict[str, list[dict[str, Any]]] = {}
            for wname, run in zip(keys, report["runs"], strict=True):
                by_workload.setdefault(wname, []).append(_run_row(run, workloads[wname]))
            for wname, results in by_workload.items():
                speeds = [r["output_tok_s"] for r in results]
                mid = results[speeds.index(statistics.median_low(speeds))]
                row = {
                    "workload": f"{wname} ({scenario.name})",
                    "policy": pname,
                    **mid,
                    "repeats": len(results),
                    "output_tok_s_runs": speeds,
                    "kv_tokens": kv_tokens,
                    "scenario": scenario.name,
                    "engine_workload": wname,
                    "sglang_schedule_policy": serve_spec.schedule_policy,
                    "feather_plugin": not own,
                }
                if report["feather"] is not None:
                    stats = report["feather"]["stats"]
                    row["policy_errors"] = stats["policy_errors"]
                    row["feather_stops"] = stats["stops"]
                    row.update(report["feather"]["counters"])
                rows.append(row)
    add_relative(rows, BASELINE, (("output_tok_s", "vs_fcfs"), ("output_tok_cpu_s", "vs_fcfs_cpu")))
    return rows


def _run_row(run: dict[str, Any], requests) -> dict[str, Any]:
    """One run's result row, the fields of `--engine vllm`'s rows."""
    import numpy as np

    reqs = run["requests"]
    bad = [
        rid
        for rid, r in reqs.items()
        if r["finish_messages"] != 1 or r["reason"]["type"] != "length"
    ]
    if bad or len(reqs) != len(requests):
        raise RuntimeError(f"{len(bad)} requests did not finish once with their length: {bad[:3]}")
    arrived = {rid: r["sent"] for rid, r in reqs.items()}
    makespan = max(r["finished"] for r in reqs.values()) - min(arrived.values())
    tokens = sum(r["tokens"] for r in reqs.values())
    ttft = np.array([r["first"] - r["sent"] for r in reqs.values()])
    latency = np.array([r["finished"] - r["sent"] for r in reqs.values()])
    loop = run["loop"]
    steps = max(1, loop["steps"])
    cpu_s = max(run.get("cpu_s", 0.0), 1e-9)
    return {
        "requests": len(reqs),
        "output_tokens": tokens,
        "makespan_s": round(makespan, 4),
        "output_tok_s": round(tokens / makespan, 2),
        "cpu_s": round(cpu_s, 3),
        "output_tok_cpu_s": round(tokens / cpu_s, 2),
        "mean_batch": round(loop["batch"] / steps, 2),
        "mean_prefix_groups": round(loop["groups"] / steps, 2),
        "ttft_p50_s": round(float(np.percentile(ttft, 50)), 4),
        "ttft_p99_s": round(float(np.percentile(ttft, 99)), 4),
        "latency_p50_s": round(float(np.percentile(latency, 50)), 4),
        "sched_us_per_step": round(loop["pick_s"] / steps * 1e6, 2),
        "steps": loop["steps"],
        "preemptions": loop["retractions"],
        "stand_in_s": round(loop.get("stand_in_s", 0.0), 4),
    }


def bench_from_cli(
    *,
    workloads: Sequence[str],
    policies: Sequence[str],
    model: str | None,
    scenarios: Sequence[Any] | None,
    max_num_seqs: int | None,
    max_batched_tokens: int,
    repeats: int,
    seed: int,
    policy_state: Path | None,
    on_progress: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
    """`feather bench --engine sglang`'s rows, title and JSON config (cli.py prints them)."""
    spec = SGLangBenchSpec(
        workloads=tuple(workloads) or None,
        policies=tuple(policies) or ("fcfs", "lpm", "feather"),
        model=model,
        scenarios=scenarios,
        max_num_seqs=max_num_seqs or SGLangBenchSpec.max_num_seqs,
        max_num_batched_tokens=max_batched_tokens,
        repeats=repeats,
        seed=seed,
        policy_state=policy_state,
    )
    rows = run_sglang_bench(spec, on_progress)
    hardware, cost_model = spec.cost_profiles()
    title = (
        f"feather bench --engine sglang: {model or 'tiny-llama'} stand-in "
        f"(cost {Path(hardware).stem}), seed {seed}, {repeats} runs"
    )
    config = {
        "engine": "sglang",
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items()},
        "step_cost": {"hardware": hardware, "model": cost_model},
        "note": BENCH_NOTE,
    }
    return rows, title, config
