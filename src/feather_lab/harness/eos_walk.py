"""Random-weight Llamas whose greedy outputs end at EOS at seeded, spread-out lengths.

With random weights a greedy decode falls into a short cycle at once: it either emits EOS in
its first few tokens or never, so "ends at EOS under a cap" would mean "ends at once or at the
cap". The walk rule makes the end a known, spread-out function of the prompt instead:

- the token embeddings are scaled up (`EMBED_SCALE`) so the current token dominates the last
  hidden state over the layers' context mix;
- the output row of token j is the unit embedding of token j - 1 (ids `FIRST`..vocab-1 in a
  ring), so greedy decoding walks p+1, p+2, ... from the prompt's last token p;
- `terminals` seeded token ids are terminal: hidden dimension 0 is their flag (zero in every
  other embedding, `FLAG` times the embedding's norm in theirs), and EOS's output row is
  `EOS_GAIN` along it, so after a terminal the argmax is EOS and after any other token it is
  not (EOS's logit there is the layers' small share of dimension 0).

A request's output is therefore 1 + the ring distance from its last prompt token to the next
terminal (1 if that token is terminal), cut at its cap: `walk_length`. Shapes, FLOPs and KV
per token are the model's own, so the step costs are unchanged; only the token ids differ.
The greedy margin is wide (the winner's logit is several times any other), so batch
composition should not flip a token; the bench checks that every policy's outputs are vLLM's
own (`outputs_differing`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from feather_sched.request import Request

__all__ = [
    "EMBED_SCALE",
    "EOS_GAIN",
    "EOS_ID",
    "FIRST",
    "FLAG",
    "RULE",
    "off_rule",
    "terminal_ids",
    "walk_length",
    "write_eos_walk",
]

RULE = "walk-flag-1"
"""The rule's version, in a built model's stamp: a model written by another is rebuilt."""
EMBED_SCALE = 30.0
"""Embedding scale: the current token's share of the last hidden state."""
FLAG = 2.0
"""A terminal's flag (dimension 0) in units of its embedding's norm."""
EOS_GAIN = 1.5
"""EOS's output row along the flag: after a terminal its logit is 1.5 x 2 = 3 norms against
the walk's sqrt(1 + 2^2) = 2.24 (the next token's row is the terminal's unit embedding)."""
EOS_ID = 2
FIRST = 4
"""Ids below are the tokenizer's specials (pad, bos, eos, unk): never walked."""


def terminal_ids(vocab_size: int, terminals: int, seed: int) -> np.ndarray:
    """The seeded terminal token ids, sorted."""
    if not 0 < terminals <= vocab_size - FIRST:
        raise ValueError(f"eos terminals must be in 1..{vocab_size - FIRST}, got {terminals}")
    rng = np.random.default_rng(seed + 1)
    return np.sort(FIRST + rng.choice(vocab_size - FIRST, terminals, replace=False))


def walk_length(last_token: int, cap: int, vocab_size: int, terminals: np.ndarray) -> int:
    """The output tokens (EOS included) greedy decoding gives after `last_token`, cut at
    `cap`: 1 + the ring distance to the next terminal at or after it."""
    ring = vocab_size - FIRST
    dist = (terminals - last_token) % ring
    return int(min(cap, 1 + dist.min()))


def off_rule(
    requests: Sequence[Request], tokens: Mapping[str, Sequence[int]], vocab: int, ends: np.ndarray
) -> int:
    """How many requests' outputs are not the rule's length (0 on a model written by it)."""
    return sum(
        len(tokens[r.request_id]) != walk_length(int(r.prompt[-1]), r.output_len, vocab, ends)
        for r in requests
    )


def write_eos_walk(model, terminals: int, seed: int) -> None:
    """Rewrite a `LlamaForCausalLM`'s embeddings and output head by the walk rule."""
    import torch

    emb = model.model.embed_tokens.weight
    head = model.lm_head.weight
    vocab = emb.shape[0]
    ends = torch.as_tensor(terminal_ids(vocab, terminals, seed))
    with torch.no_grad():
        emb.mul_(EMBED_SCALE)
        emb[:, 0] = 0.0
        emb[ends, 0] = FLAG * emb[ends].norm(dim=1)
        unit = emb / emb.norm(dim=1, keepdim=True)
        ids = torch.arange(FIRST, vocab)
        head.zero_()
        head[ids] = unit[torch.roll(ids, 1)]
        head[EOS_ID, 0] = EOS_GAIN
