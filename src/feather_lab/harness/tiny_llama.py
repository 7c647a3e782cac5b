"""Small random-weight Llamas, written to disk at run time, for the real-engine tests and bench.

No download: seeded `LlamaForCausalLM(config)` weights and a word-level tokenizer, so `vllm
serve DIR` works too. Each shape is the model profile of the same name in
`cost/profiles/models.json`, read from it: `tiny-llama`, dominated by per-step
overhead; `kv-bound`, 4 KiB of KV per token per layer, so a few distinct 2,000-token prefixes
overflow a CPU's last-level cache and decode steps are dominated by KV reads. Needs torch,
transformers and tokenizers (the `vllm` extra).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from feather_sched.cost.profiles import load_model

__all__ = ["ENGINE_MODELS", "KV_BOUND", "TINY_LLAMA", "TinyLlamaSpec", "build_tiny_llama"]


@dataclass(frozen=True)
class TinyLlamaSpec:
    """A Llama shape to write with random weights; `of_profile` reads the built-in model
    profile of the same name, so the cost model and the engine model cannot drift apart (the
    shape has no defaults of its own: the profiles in `cost/profiles/models.json` hold them)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str
    seed: int = 0
    eos_terminals: int = 0
    """0: plain random weights (greedy outputs rarely or never reach EOS). N > 0: the weights
    written so greedy decoding ends at EOS at seeded points (`eos_walk`)."""

    @classmethod
    def of_profile(cls, name: str) -> TinyLlamaSpec:
        p = load_model(name)
        return cls(
            p.num_layers,
            p.hidden_size,
            p.num_heads,
            p.num_kv_heads,
            p.intermediate_size,
            p.vocab_size,
            p.max_context_tokens,
            _DTYPES[p.dtype_bytes],
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


_DTYPES = {4: "float32", 2: "bfloat16"}
TINY_LLAMA = TinyLlamaSpec.of_profile("tiny-llama")
KV_BOUND = TinyLlamaSpec.of_profile("kv-bound")
ENGINE_MODELS: dict[str, TinyLlamaSpec] = {"tiny-llama": TINY_LLAMA, "kv-bound": KV_BOUND}
"""Built-in engine models by name (`feather bench/calibrate --engine vllm --model NAME`)."""
_STAMP = "feather-tiny-llama.json"


def build_tiny_llama(path: str | Path, spec: TinyLlamaSpec = TINY_LLAMA) -> Path:
    """Write config, random weights and a tokenizer to `path` (reused if already built)."""
    out = Path(path)
    stamp = out / _STAMP
    written = asdict(spec)
    if spec.eos_terminals:
        from feather_lab.harness.eos_walk import RULE

        written["eos_rule"] = RULE  # a changed rule rewrites the weights
    if stamp.is_file() and json.loads(stamp.read_text()) == written:
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        attention_bias=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        torch_dtype=spec.dtype,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))
    if spec.eos_terminals:
        from feather_lab.harness.eos_walk import write_eos_walk

        write_eos_walk(model, spec.eos_terminals, spec.seed)
    model.save_pretrained(out, safe_serialization=True)
    _write_tokenizer(out, spec.vocab_size, spec.max_position_embeddings)
    stamp.write_text(json.dumps(written))
    return out


def _write_tokenizer(out: Path, vocab_size: int, max_length: int) -> None:
    """Word-level tokenizer: token id i <-> word "t{i}"; ids 0-2 are pad/bos/eos."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    vocab.update({"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3})
    for i in range(4):
        del vocab[f"t{i}"]
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=max_length,
    )
    fast.save_pretrained(out)
