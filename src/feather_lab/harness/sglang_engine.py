"""SGLang's real `Scheduler` on CPU, with a stand-in model forward: the harness behind the
`sglang` scheduler-loop tests and `feather bench --engine sglang`.

SGLang's own: everything a server's scheduler process runs, constructed as
`run_scheduler_process` does (plugins first, so `SGLANG_PLUGINS`/`FEATHER_POLICY` decide
whether Feather is on), fed over its own ZMQ sockets. Not SGLang's: the model, a registered
stand-in (`FeatherStandInForCausalLM`, dummy weights) whose forward sleeps what the calibrated
CPU cost model gives the batch's real shape. One `Scheduler` per process (SGLang builds its
parallel groups once per process), so each `serve()` runs in a fresh spawned child.
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
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from feather_lab.harness.sglang_client import Client
from feather_lab.harness.sglang_spec import SERVER_ARGS, ServeSpec
from feather_lab.harness.tiny_llama import TinyLlamaSpec
from feather_sched.policies.base import Policy, SchedulerView

STANDIN_ARCH = "FeatherStandInForCausalLM"
EOS_TOKEN = 2
FIRST_TOKEN = 4
"""Generated ids are >= 4 (0-3: pad, bos, eos, unk), so a request never stops early."""
_FORWARD_S = [0.0]
"""Seconds spent inside the stand-in forward in this process (its sleeps included)."""
_FORWARD_CPU_S = [0.0]
"""CPU seconds of the scheduler thread inside the stand-in forward (its logits, not SGLang's)."""
_PRICING_S = [0.0, 0.0]
"""Wall and CPU seconds the harness spent pricing batches (`_step_cost`): part of the step
the profile gives, so the forward sleeps that much less, and none of SGLang's own time."""
_PENDING_COST = [0.0]
"""The calibrated cost of the batch SGLang is about to run (set by `_LoopProbe`, from the
`ScheduleBatch`, which holds what a `ForwardBatch` does not: the req_to_token pool)."""


def stand_in_config(model: TinyLlamaSpec) -> dict[str, Any]:
    """The config.json the stand-in is built from: the shape SGLang sizes its KV pool by
    (one of the built-in engine models, harness/tiny_llama.py)."""
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
    _plugin_env(spec)

    from feather_sched.policies.registry import register_policy
    from feather_sched.sglang.cpu import prepare_cpu_import

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
    from sglang.srt.server_args import PortArgs

    server_args = _server_args(spec, model_dir)
    port_args = PortArgs.init_new(server_args)
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    t_build = time.perf_counter()
    scheduler = Scheduler(server_args, port_args)
    build_s = time.perf_counter() - t_build

    probe = _LoopProbe(scheduler, spec)
    queue = _feather_queue(scheduler)
    loaded_table = _table(queue)
    client = Client(spec, port_args, probe)
    thread = threading.Thread(target=client.main, name="feather-client", daemon=True)
    thread.start()
    scheduler.run_event_loop()  # SGLang's loop, until the client's ShutdownReq
    thread.join(60)
    if client.error is not None:
        raise RuntimeError(f"client failed: {client.error}")

    times = (build_s, t_build - t_start, time.perf_counter() - t_start)
    return _report(scheduler, queue, client, probe, loaded_table, times)


def _plugin_env(spec: ServeSpec) -> None:
    """The environment a server's scheduler process would have: Feather's plugin and its
    settings when a Feather policy runs, none of it otherwise."""
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


def _server_args(spec: ServeSpec, model_dir: Path):
    """SGLang's `ServerArgs` for the stand-in model on CPU."""
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(
        model_path=str(model_dir),
        device="cpu",
        load_format="dummy",
        dtype="float32",
        skip_tokenizer_init=True,
        attention_backend="torch_native",
        disable_cuda_graph=True,
        disable_overlap_schedule=not spec.overlap,
        mem_fraction_static=0.1,
        random_seed=spec.seed,
        log_level="error",
        **{name: getattr(spec, name) for name in SERVER_ARGS},
    )


def _report(scheduler, queue, client, probe, loaded_table, times) -> dict[str, Any]:
    """What the child sends back: timings, every run's results, the loop's counters and
    Feather's state when it ran."""
    build_s, startup_s, process_s = times
    report: dict[str, Any] = {
        "build_s": round(build_s, 3),
        "startup_s": round(startup_s, 3),
        "process_s": round(process_s, 3),
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

    from feather_sched.sglang.plugin import HOOK_TARGETS, around_next_batch

    hooks = [
        (h, getattr(src, "plugin_name", None))
        for target in HOOK_TARGETS
        for _, h, src in HookRegistry._hooks.get(target, ())
    ]
    loaded_by_sglang = all(name == "feather" for _, name in hooks)  # load_plugins' source
    return (
        len(hooks) == len(HOOK_TARGETS)
        and loaded_by_sglang
        and (around_next_batch in [h for h, _ in hooks])
    )


def _feather_queue(scheduler):
    from feather_sched.sglang.plugin import queue_for

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
            t0, c0 = time.perf_counter(), time.thread_time()
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
            _FORWARD_CPU_S[0] += time.thread_time() - c0
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
        self.pick_s = self.pick_cpu_s = 0.0
        self.max_running = 0
        self._loop_clock = time.pthread_getcpuclockid(threading.get_ident())
        """The CPU clock of the thread that builds the probe: the one that runs the loop."""
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
                t0, c0 = time.perf_counter(), time.thread_time()
                cost = self.cost_of(batch)
                self.costs_s += cost
                priced = time.perf_counter() - t0
                _PRICING_S[0] += priced
                _PRICING_S[1] += time.thread_time() - c0
                _PENDING_COST[0] = cost - priced  # pricing is inside the step, not added
            return run_batch(batch, *args, **kwargs)

        def on_pick(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return pick(*args, **kwargs)
            finally:
                self.pick_s += time.perf_counter() - t0
                self.pick_cpu_s += time.thread_time() - c0

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
            "pick_cpu_s": self.pick_cpu_s,
            "stand_in_s": _FORWARD_S[0],
            "stand_in_cpu_s": _FORWARD_CPU_S[0],
            "priced_s": self.costs_s,
            "pricing_s": _PRICING_S[0],
            "pricing_cpu_s": _PRICING_S[1],
            "loop_cpu_s": time.clock_gettime(self._loop_clock),
        }

    def summary(self) -> dict[str, Any]:
        return {
            **self.mark(),
            "extend_steps": self.extend_steps,
            "retracted": dict(self.retracted),
            "admitted": dict(self.admitted),
            "max_batch": self.max_running,
        }


# ---------------------------------------------------------------------------- test policies
class RaisingPolicy(Policy):
    """Fault injection for the loop tests: two candidates, then an exception (SGLang must
    finish the pass in its own order and keep serving)."""

    name = "raising"

    def candidates(self, view: SchedulerView) -> Iterator[str]:
        waiting = list(view.waiting_ids())
        yield from waiting[-2:]
        raise RuntimeError("policy bug")
