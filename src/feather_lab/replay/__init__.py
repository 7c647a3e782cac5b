"""`feather replay`: a workload sent to a live OpenAI-compatible server (vLLM's or SGLang's
`/v1/completions`), measured from the client the way `vllm bench serve` and SGLang's
`bench_serving` do, and the same schedule run against several servers for an A/B.

- `workload`: the bench's workloads (names, traces, arrivals, limits) sized for a server.
- `client`: the async HTTP client (httpx, the `replay` extra; the requests stream through
  aiohttp where installed, `transport`): preflight, one streamed request, the schedule kept
  however slow the server is.
- `datasets`, `sharegpt`, `tokenizer`: `vllm bench serve`'s datasets by its rules.
- `native`: SGLang's native `/generate` request and stream (`--api generate`).
- `metrics`: the server's Prometheus counters, scraped before and after (and its queue
  gauges sampled during) a run.
- `summary`: one run's row (latency percentiles, throughput, goodput, failures) and the A/B
  medians with B/A per metric.
"""
