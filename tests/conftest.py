"""Session-wide test setup.

Triton decides at import time whether `@triton.jit` builds compiled or interpreted kernels
(its own library functions, `tl.sum` and the like, are jit functions too), so the switch that
lets the Triton kernel tests (marked `triton`) run on CPU tensors must be set before anything
imports triton. Nothing in this test suite runs a compiled Triton kernel."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
