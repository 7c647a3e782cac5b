"""`feather probe` (feather_lab.probe): the paged layout, the torch reference attention, the
Triton kernel under TRITON_INTERPRET=1 (marked `triton`), and a tiny CPU run end to end."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from feather_lab.probe.layout import GRIDS, build_layout
from feather_sched.cost import BatchShape, StepCostModel, load_hardware
from feather_sched.cost.composition import Composition

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- layout (numpy)


def test_layout_shares_prefix_blocks_and_keeps_suffixes_private():
    comp = Composition(batch=6, prefixes=2, prefix_len=64, suffix_len=20)
    lay = build_layout(comp, block_size=16, seed=3)
    assert lay.block_tables.shape == (6, 4 + 2)
    assert lay.num_blocks == comp.num_blocks(16) == 2 * 4 + 6 * 2
    prefix = lay.block_tables[:, :4]
    for i in range(6):  # request i carries prefix i % 2: same physical blocks
        assert (prefix[i] == prefix[i % 2]).all()
    assert not set(prefix[0]) & set(prefix[1])
    own = lay.block_tables[:, 4:].ravel()
    assert len(set(own)) == own.size and not set(own) & set(prefix.ravel())
    assert set(lay.block_tables.ravel()) == set(range(lay.num_blocks))
    assert (lay.context_lens == 84).all()
    # this step's token goes to position 83: block 5 of the table, offset 3
    assert (lay.slots == lay.block_tables[:, 5].astype(np.int64) * 16 + 3).all()


def test_layout_shape_matches_the_token_exact_shape():
    comp = Composition(batch=8, prefixes=4, prefix_len=128, suffix_len=16)
    got = build_layout(comp, 16).shape()
    want = BatchShape.shared_prefix_decode([2, 2, 2, 2], 128, 16)
    for f in ("num_decode", "logical_kv_tokens", "unique_kv_tokens", "shared_unique_kv_tokens"):
        assert getattr(got, f) == getattr(want, f), f
    assert got.shared_logical_kv_tokens == want.shared_logical_kv_tokens
    distinct = build_layout(Composition(8, 8, 128, 16), 16).shape()
    assert distinct.shared_unique_kv_tokens == 0 and distinct.unique_kv_tokens == 8 * 144


def test_layout_rejects_partial_prefix_blocks():
    with pytest.raises(ValueError, match="multiple of block_size"):
        build_layout(Composition(2, 1, 40, 8), 16)


def test_grids_cover_one_to_all_distinct_prefixes():
    comps = GRIDS["cuda"].compositions()
    assert {c.batch for c in comps} == {1, 8, 32, 128, 512}
    assert {c.prefix_len for c in comps} == {512, 2048, 8192, 16384}
    big = {c.prefixes for c in comps if c.batch == 512}
    assert big == {1, 64, 512}
    for name, grid in GRIDS.items():
        for b in grid.batches:
            if b > 1:
                assert len(grid.groups(b)) >= 2, name


# --------------------------------------------------------------------------- torch


def _torch():
    return pytest.importorskip("torch", reason="the probe's CPU path needs torch (extra 'probe')")


def _random_batch(torch, comp, num_heads, num_kv_heads, head_dim, dtype=None):
    lay = build_layout(comp, 16, seed=1)
    g = torch.Generator().manual_seed(0)
    dtype = dtype or torch.float32
    kc = torch.randn(lay.num_blocks, 16, num_kv_heads, head_dim, generator=g).to(dtype)
    vc = torch.randn(lay.num_blocks, 16, num_kv_heads, head_dim, generator=g).to(dtype)
    q = torch.randn(comp.batch, num_heads, head_dim, generator=g).to(dtype)
    bt = torch.from_numpy(lay.block_tables)
    cl = torch.from_numpy(lay.context_lens)
    return lay, q, kc, vc, bt, cl


def _dense_attention(torch, lay, q, kc, vc, scale):
    """Each request's context in token order, from its logical block list; plain softmax."""
    out = []
    group = q.shape[1] // kc.shape[2]
    for i, n in enumerate(lay.context_lens.tolist()):
        blocks = lay.block_tables[i].tolist()
        k = torch.cat([kc[b] for b in blocks])[:n]  # [n, kv_heads, dim]
        v = torch.cat([vc[b] for b in blocks])[:n]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        w = torch.softmax(torch.einsum("hd,nhd->hn", q[i], k) * scale, dim=-1)
        out.append(torch.einsum("hn,nhd->hd", w, v))
    return torch.stack(out)


def test_reference_attention_matches_dense_softmax():
    torch = _torch()
    from feather_lab.probe.attention import reference_paged_decode

    comp = Composition(batch=5, prefixes=2, prefix_len=48, suffix_len=7)
    lay, q, kc, vc, bt, cl = _random_batch(torch, comp, 8, 2, 32)
    got = reference_paged_decode(q, kc, vc, bt, cl, 32**-0.5)
    want = _dense_attention(torch, lay, q, kc, vc, 32**-0.5)
    assert torch.allclose(got, want, atol=1e-5)


def test_cpu_probe_end_to_end(tmp_path):
    """A tiny grid on tiny-llama: rows, held-out MAPE, a profile the simulator loads."""
    _torch()
    from feather_lab.probe.run import run_probe
    from feather_lab.probe.spec import ProbeSpec

    comps = [Composition(b, g, p, 16) for b in (1, 4) for g in (1, 2) for p in (32, 64) if g <= b]
    spec = ProbeSpec(device="cpu", model="tiny-llama", reps=2, warmup=1, compositions=comps)
    out, res = tmp_path / "P.json", tmp_path / "R.json"
    report = run_probe(spec, out, res, None, log=lambda _s: None)
    data = json.loads(res.read_text())
    assert len(data["rows"]) == len(comps)
    row = data["rows"][0]
    for key in ("batch", "prefixes", "prefix_len", "decode_ms", "attn_ms", "predicted_ms"):
        assert key in row
    assert len({r["prefixes"] for r in data["rows"]}) >= 2
    assert data["heldout_mape"] is not None and data["samples"]["heldout"] == 1
    assert data["config"]["statistic"] == "min" and data["machine"]["cores"]
    assert report["homogeneity"] and report["homogeneity"][0]["prefixes"] == [1, 2]
    hw = load_hardware(str(out))
    assert hw.name == "cpu-probe-fitted" and "feather probe" in hw.sources["step_overhead_s"]
    StepCostModel(hw, "llama-3-8b").step_time(BatchShape.shared_prefix_decode([8], 512, 16))


def test_probe_rejects_unknown_grid_and_kernel():
    _torch()
    from feather_lab.probe.attention import kernels
    from feather_lab.probe.run import run_probe
    from feather_lab.probe.spec import ProbeSpec

    with pytest.raises(ValueError, match="unknown grid"):
        run_probe(ProbeSpec(device="cpu", grid="nope"), log=lambda _s: None)
    with pytest.raises(ValueError, match="unknown kernel"):
        kernels("cpu", ["nope"])
    with pytest.raises(ValueError, match="flashinfer needs"):
        kernels("cpu", ["flashinfer"])


# --------------------------------------------------------------------------- triton


@pytest.mark.triton
def test_triton_kernel_matches_reference_interpreted():
    """The Triton kernel against the reference under TRITON_INTERPRET=1 (Triton's interpreter,
    CPU tensors), alone over four layouts (one to three splits, GQA, MQA, Llama-3-8B's heads)
    and inside the decode step. Its own process: triton fixes its interpret mode when first
    imported. Skips without triton (FEATHER_REQUIRE_TRITON=1 makes that a failure, for CI)."""
    _torch()
    if os.environ.get("FEATHER_REQUIRE_TRITON") != "1":
        pytest.importorskip("triton", reason="the Triton kernel test needs triton (extra 'probe')")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "feather_lab.probe.selfcheck", "--device", "cpu"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["interpreted"] and len(report["cases"]) == 4
    for case in report["cases"]:
        assert case["max_abs_err"] <= case["tol"], case
    assert report["decode_step_max_abs_err"] <= 1e-4
    assert report["ok"] and proc.returncode == 0


# --------------------------------------------------------------------------- run.sh


def test_gpu_run_script_is_executable_and_parses():
    script = ROOT / "benchmarks" / "gpu" / "run.sh"
    assert script.stat().st_mode & stat.S_IXUSR
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_probe_entry_point_needs_no_cli_dependencies():
    """A lent GPU machine has torch, triton and numpy, maybe nothing else: the probe's entry
    point (`python -m feather_lab.probe`) imports none of typer, rich, xxhash, matplotlib."""
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('typer', 'rich', 'xxhash', 'matplotlib'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import feather_lab.probe.__main__, feather_lab.probe.decoder\n"
        "import feather_lab.probe.attention, feather_lab.probe.selfcheck\n"
        "from feather_lab.probe.plot import plot_results\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_cli_probe_command_reports_bad_input():
    """`feather probe` is one thin command; a bad device is an error with exit status 2."""
    _torch()
    from typer.testing import CliRunner

    from feather_lab.cli import app

    result = CliRunner().invoke(app, ["probe", "--device", "tpu"])
    assert result.exit_code == 2
    assert "--device must be cuda or cpu" in result.output


def test_probe_goes_on_past_a_failing_composition(tmp_path, monkeypatch):
    """A composition whose kernel fails (out of memory, say) is listed, the rest measured."""
    _torch()
    from feather_lab.probe import attention
    from feather_lab.probe.run import run_probe
    from feather_lab.probe.spec import ProbeSpec

    def flaky(q, *args, **kwargs):
        if q.shape[0] == 3:
            raise RuntimeError("out of memory (simulated)")
        return attention.reference_paged_decode(q, *args, **kwargs)

    monkeypatch.setattr(attention, "kernels", lambda device, names=None: {"flaky": flaky})
    comps = [Composition(b, 1, 32, 16) for b in (1, 2, 3, 4, 5)]
    spec = ProbeSpec(device="cpu", model="tiny-llama", reps=1, warmup=0, compositions=comps)
    report = run_probe(spec, None, tmp_path / "R.json", None, log=lambda _s: None)
    assert [r["batch"] for r in report["rows"]] == [1, 2, 4, 5]
    assert len(report["config"]["failed"]) == 1 and "B3-G1" in report["config"]["failed"][0]
    assert not (tmp_path / "R.json.partial").exists()
