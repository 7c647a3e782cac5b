"""Questions about long documents: many short questions behind each document.

Retrieval/long-context QA puts a whole document in front of every question, so
the shared part is long and the distinct part short, like the paper's case but
with more, mid-sized groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from feather_sched.request import Request
from feather_sched.workloads.arrivals import AllAtOnce, ArrivalProcess
from feather_sched.workloads.base import (
    Draft,
    coerce_arrival,
    finish,
    random_tokens,
    require_int,
    require_vocab,
    seed_streams,
)

__all__ = ["DocumentQAWorkload"]


@dataclass(frozen=True)
class DocumentQAWorkload:
    """`num_documents` documents, `questions_per_document` questions each; prompt = doc + question.

    Request ids are "dq-NNNNNN", `group` is "doc-D", meta["prefix_len"] the
    document length.
    """

    num_documents: int = 8
    document_len: int = 8000
    questions_per_document: int = 16
    question_len: int = 64
    output_len: int = 128
    vocab_size: int = 32000
    arrival: ArrivalProcess = field(default_factory=AllAtOnce)
    shuffle: bool = True

    def __post_init__(self) -> None:
        owner = type(self).__name__
        require_int(owner, "num_documents", self.num_documents, 0)
        require_int(owner, "document_len", self.document_len, 0)
        require_int(owner, "questions_per_document", self.questions_per_document, 0)
        require_int(owner, "question_len", self.question_len, 0)
        require_int(owner, "output_len", self.output_len, 1)
        require_vocab(owner, self.vocab_size)
        if self.document_len + self.question_len < 1:
            raise ValueError(f"{owner}: document_len + question_len must be >= 1")
        coerce_arrival(self, self.arrival)

    def generate(self, seed: int) -> list[Request]:
        streams = seed_streams(seed)
        drafts: list[Draft] = []
        for d in range(self.num_documents):
            document = random_tokens(streams.content, self.document_len, self.vocab_size)
            questions = random_tokens(
                streams.content, (self.questions_per_document, self.question_len), self.vocab_size
            )
            drafts.extend(
                Draft(
                    prompt=np.concatenate([document, q]),
                    output_len=self.output_len,
                    group=f"doc-{d}",
                    meta={"prefix_len": self.document_len},
                )
                for q in questions
            )
        return finish("dq", drafts, self.arrival, streams, shuffle=self.shuffle)
