"""Write a document-QA burst trace (Feather JSONL) of a production shape, to bench with
`feather bench --workload trace:PATH`.

The shape: ~1,000 requests arriving at once, 85 documents of 1k-25k tokens (log-normal,
median ~4k), 1-21 questions per document (~12 on average), 64-token answers; each prompt
is its document plus a 32-token question, under a client's default cap (`workloads.caps`:
256 tokens).
Usage: python benchmarks/sim/doc_qa_burst.py OUT.jsonl [--seed N]
"""

from __future__ import annotations

import argparse

import numpy as np

from feather_lab.workloads.caps import client_cap
from feather_lab.workloads.traces import write_jsonl
from feather_sched.request import Request

DOCUMENTS = 85
DOC_MEDIAN, DOC_SIGMA, DOC_RANGE = 4000, 0.8, (1000, 25000)
QUESTIONS = (1, 21)
QUESTION_LEN = 32
ANSWER = 64
VOCAB = 32000


def burst(seed: int) -> list[Request]:
    """The burst's requests, documents in turn, questions shuffled across documents."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(DOC_MEDIAN), DOC_SIGMA, DOCUMENTS), *DOC_RANGE)
    counts = rng.integers(QUESTIONS[0], QUESTIONS[1] + 1, DOCUMENTS)
    prompts = []
    for d, (length, count) in enumerate(zip(lengths.astype(int), counts, strict=True)):
        doc = rng.integers(0, VOCAB, int(length), dtype=np.int32)
        for _ in range(count):
            question = rng.integers(0, VOCAB, QUESTION_LEN, dtype=np.int32)
            prompts.append((d, np.concatenate([doc, question])))
    order = rng.permutation(len(prompts))
    return [
        Request(
            f"dqb-{i:06d}",
            prompts[j][1],
            ANSWER,
            0.0,
            group=f"doc-{prompts[j][0]}",
            max_tokens=client_cap(ANSWER),
        )
        for i, j in enumerate(order)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    requests = burst(args.seed)
    write_jsonl(args.out, requests)
    lengths = sorted({r.group: r.prompt_len for r in requests}.values())
    print(f"{len(requests)} requests, {len(lengths)} documents, median prompt "
          f"{int(np.median(lengths)):,} tokens, wrote {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
