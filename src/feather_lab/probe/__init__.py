"""`feather probe`: measure decode steps on real kernels (GPU or CPU) and fit a hardware profile.

No serving engine is needed: a decode step's time is the model's matrix products plus paged
attention over a batch whose requests share, or do not share, prefix blocks; both are built
here from a model profile's shapes with random weights (`layout`, `decoder`, the kernels in
`attention`, `triton_decode`, `flashinfer_decode`). `run` times the grid and `fit` fits the
profile. Only numpy and torch (and triton on a GPU) are imported, so `python -m
feather_lab.probe` runs on a machine that has nothing else (benchmarks/gpu/run.sh).
"""
