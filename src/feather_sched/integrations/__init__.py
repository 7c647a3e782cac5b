"""Deprecated names kept for servers configured before the engines had folders of their own:
`feather_sched.vllm`, `feather_sched.sglang` and `feather_sched.ray` are the names to use."""
