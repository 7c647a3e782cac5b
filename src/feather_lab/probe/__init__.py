"""`feather probe`: measure decode steps on real kernels (GPU or CPU) and fit a hardware profile.

No serving engine is needed: the two things that decide a decode step's time are the model's
matrix products and paged attention over a batch whose requests share, or do not share,
prefix blocks. This package builds both from a model profile's shapes with random weights:

- `layout`: the composition grid and a vLLM-style paged KV layout (block tables; requests that
  share a prefix point at the same physical blocks), with each batch's exact `BatchShape`.
- `attention`: the torch reference paged decode attention (the CPU path, and the tests' oracle).
- `triton_decode`: a plain paged decode kernel in Triton (one program per sequence, KV head and
  split, reading that sequence's blocks through its block table, as vLLM's plain paged kernels
  do); `flashinfer_decode`: FlashInfer's batch decode, only when it is importable.
- `decoder`: random-weight decode step (every layer's matrix products + attention).
- `run`: times the grid, fits the hardware profile with `cost.fit`, reports
  held-out MAPE, writes PROFILE.json / RESULTS.json and a plot (`plot`).
- `selfcheck`: the Triton kernel against the reference (on CPU under TRITON_INTERPRET=1, in its
  own process; on the GPU before timing).

Only numpy and torch (and triton on a GPU) are imported, so `python -m feather_lab.probe`
runs on a machine that has nothing else (benchmarks/gpu/run.sh).
"""
