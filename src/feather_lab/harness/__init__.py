"""harness: real engines in process for `feather bench --engine` and `feather calibrate`.

vLLM's CPU build and SGLang's scheduler loop run here on the tiny random-weight models built
at run time (`tiny_llama`), with the workloads scaled to them (`vllm_spec`); the runs' rows go
to the bench's rendering (`bench.report`, `bench.output`) and their step samples to the cost
model's fit (`cost.fit`). The engine adapters themselves (`feather_sched.vllm`, `.sglang`,
`.ray`) never import this package: a deployment loads Feather without the harness.
"""
