"""`python -m feather_lab.probe.selfcheck [--device cpu|cuda]`: the Triton kernel against the
torch reference, alone and inside the decode step; prints one JSON line, exit status 1 on a
mismatch.

On cpu it runs under TRITON_INTERPRET=1 (Triton's interpreter, CPU tensors). Triton fixes its
interpret mode when it is first imported (its library functions, `tl.sum` and the like, are
jit functions too), so this runs as its own process: the tests (marked `triton`) start it, and
benchmarks/gpu/run.sh runs it on the GPU before timing anything."""

from __future__ import annotations

import argparse
import json
import os
import sys

CASES = [
    # (batch, prefixes, prefix_len, suffix_len, heads, kv_heads, head_dim)
    (5, 2, 768, 20, 8, 2, 32),  # two splits of 512 tokens, GQA 4
    (3, 1, 32, 5, 4, 4, 64),  # one split, no GQA
    (4, 4, 0, 7, 8, 1, 32),  # no prefix, multi-query
    (2, 1, 512, 17, 32, 8, 128),  # Llama-3-8B's heads, two splits
]


def run(device: str) -> dict:
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from feather_lab.probe.attention import reference_paged_decode
    from feather_lab.probe.decoder import RandomDecoder
    from feather_lab.probe.layout import build_layout
    from feather_lab.probe.triton_decode import triton_paged_decode
    from feather_sched.cost import load_model
    from feather_sched.cost.composition import Composition

    dtypes = [torch.float32] + ([torch.bfloat16] if device == "cuda" else [])
    out: dict = {"device": device, "interpreted": device == "cpu", "cases": []}
    ok = True
    g = torch.Generator().manual_seed(0)
    for b, p, plen, slen, h, kvh, d in CASES:
        lay = build_layout(Composition(b, p, plen, slen), 16, seed=1)
        for dtype in dtypes:
            kc = torch.randn(lay.num_blocks, 16, kvh, d, generator=g).to(device, dtype)
            vc = torch.randn(lay.num_blocks, 16, kvh, d, generator=g).to(device, dtype)
            q = torch.randn(b, h, d, generator=g).to(device, dtype)
            bt = torch.from_numpy(lay.block_tables).to(device)
            cl = torch.from_numpy(lay.context_lens).to(device)
            got = triton_paged_decode(q, kc, vc, bt, cl, d**-0.5).float()
            want = reference_paged_decode(q, kc, vc, bt, cl, d**-0.5).float()
            err = float((got - want).abs().max())
            tol = 2e-2 if dtype == torch.bfloat16 else (1e-4 if device == "cpu" else 5e-3)
            ok &= err <= tol
            out["cases"].append(
                {"case": lay.composition.label, "heads": [h, kvh, d],
                 "dtype": str(dtype), "max_abs_err": err, "tol": tol}
            )  # fmt: skip
    lay = build_layout(Composition(3, 2, 32, 16), 16)
    dec = RandomDecoder(load_model("tiny-llama"), device, torch.float32, lay.num_blocks, 2)
    batch = dec.batch(lay)
    with torch.inference_mode():
        a = dec.step(batch, triton_paged_decode)
        r = dec.step(batch, reference_paged_decode)
    step_err = float((a - r).abs().max())
    ok &= tuple(a.shape) == (3, 512) and step_err <= (1e-4 if device == "cpu" else 5e-3)
    out["decode_step_max_abs_err"] = step_err
    out["ok"] = bool(ok)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m feather_lab.probe.selfcheck")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    report = run(p.parse_args(argv).device)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
