"""Hardware and model profiles for the step-time cost model.

Profiles are data: the built-in ones live in ``profiles/hardware.json`` and
``profiles/models.json`` next to this module, each numeric field with its source
in a ``sources`` mapping. A profile can also be loaded from a JSON file holding one
profile (that is how ``feather calibrate`` hands back a fitted hardware profile):

    {"name": "h100-fitted", "mem_bandwidth_Bps": 3.35e12, ..., "sources": {...}}

Profiles are frozen dataclasses validated on construction, so a bad value is
reported with the profile and field it came from whether it was read from JSON or
made with :meth:`HardwareProfile.replace`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

__all__ = [
    "PROVENANCES",
    "HardwareProfile",
    "ModelProfile",
    "ProfileError",
    "list_hardware",
    "list_models",
    "load_hardware",
    "load_model",
]


class ProfileError(ValueError):
    """A profile is unknown, malformed, or has an out-of-range field."""


# --------------------------------------------------------------------------- checks
# Each check returns None when the value is fine, else a phrase for the error message.


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _positive(v: Any) -> str | None:
    return None if _is_number(v) and v > 0 else "must be a finite number > 0"


def _non_negative(v: Any) -> str | None:
    return None if _is_number(v) and v >= 0 else "must be a finite number >= 0"


def _fraction(v: Any) -> str | None:
    return None if _is_number(v) and 0 < v <= 1 else "must be a number in (0, 1]"


def _fraction0(v: Any) -> str | None:
    return None if _is_number(v) and 0 <= v <= 1 else "must be a number in [0, 1]"


def _positive_int(v: Any) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and v > 0
    return None if ok else "must be an integer > 0"


def _non_negative_int(v: Any) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
    return None if ok else "must be an integer >= 0"


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def _text(v: Any) -> str | None:
    return None if isinstance(v, str) else "must be a string"


PROVENANCES = ("measured", "derived", "estimate")
"""Where a hardware profile's constants come from: `measured` (fitted from a run on that
hardware), `derived` (a measured profile's kernel and cache constants carried to another
chip with its datasheet figures), `estimate` (assumptions, nothing measured)."""


def _provenance(v: Any) -> str | None:
    return None if v in PROVENANCES else f"must be one of {', '.join(PROVENANCES)}"


_Checks = Mapping[str, Callable[[Any], "str | None"]]


def _validate(obj: Any, kind: str, checks: _Checks) -> None:
    name = obj.name
    if not isinstance(name, str) or not name:
        raise ProfileError(f"{kind} profile: field 'name' must be a non-empty string, got {name!r}")
    for fname, check in checks.items():
        value = getattr(obj, fname)
        problem = check(value)
        if problem is not None:
            raise ProfileError(
                f"{kind} profile {name!r}: field {fname!r} {problem} (got {value!r})"
            )
    sources = obj.sources
    if not isinstance(sources, Mapping):
        raise ProfileError(f"{kind} profile {name!r}: field 'sources' must be a mapping")
    known = {f.name for f in dataclasses.fields(obj)}
    for key, text in sources.items():
        if key not in known:
            raise ProfileError(
                f"{kind} profile {name!r}: 'sources' names unknown field {key!r}; "
                f"fields are {', '.join(sorted(known))}"
            )
        if not isinstance(text, str) or not text:
            raise ProfileError(
                f"{kind} profile {name!r}: source for field {key!r} must be a non-empty string"
            )
    # Read-only view so a frozen profile stays frozen (sources is excluded from eq/hash).
    object.__setattr__(obj, "sources", MappingProxyType(dict(sources)))


class _ProfileIO:
    """Shared dict/JSON conversion; subclasses set _KIND and _CHECKS."""

    _KIND: ClassVar[str]
    _CHECKS: ClassVar[_Checks]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], name: str | None = None, origin: str = ""):
        """Build a profile from a JSON-like mapping; ``name`` overrides ``data["name"]``."""
        where = f"{origin}: " if origin else ""
        if not isinstance(data, Mapping):
            raise ProfileError(f"{where}{cls._KIND} profile must be a JSON object")
        d = {k: v for k, v in data.items() if not k.startswith("_")}
        if name is not None:
            d["name"] = name
        label = d.get("name", "?")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise ProfileError(
                f"{where}{cls._KIND} profile {label!r}: unknown field(s) {', '.join(unknown)}; "
                f"valid fields are {', '.join(fields)}"
            )
        missing = [
            f.name
            for f in fields.values()
            if f.name not in d
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ProfileError(
                f"{where}{cls._KIND} profile {label!r}: missing field(s) {', '.join(missing)}"
            )
        try:
            return cls(**d)
        except ProfileError as e:
            raise ProfileError(f"{where}{e}") from None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``sources`` as a dict), the format ``from_dict`` reads."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        out["sources"] = dict(out["sources"])
        return out

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent) + "\n"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write this profile as a one-profile JSON file that ``load_*(path)`` reads back."""
        p = Path(path)
        p.write_text(self.to_json(), encoding="utf-8")
        return p


# --------------------------------------------------------------------------- hardware


@dataclass(frozen=True)
class HardwareProfile(_ProfileIO):
    """Peak figures of one accelerator plus the parameters calibration fits.

    ``cache_bytes`` is the last-level on-chip cache the KV reuse model uses (L2 on
    GPUs, L3 on CPUs). The fitted parameters are the four after it and the three
    defaulted ones (`feather calibrate` and `feather probe` fit them).
    """

    name: str
    mem_bandwidth_Bps: float
    """Peak memory bandwidth, bytes per second (the datasheet's figure)."""
    peak_flops: float
    """Peak dense FLOP/s at the model's dtype (the datasheet's figure)."""
    cache_bytes: float
    """The last-level cache the KV reads of a step can hit (GPU L2, CPU L3), bytes."""
    bandwidth_efficiency: float
    """Achieved fraction of `mem_bandwidth_Bps`."""
    compute_efficiency: float
    """Achieved fraction of `peak_flops`."""
    cache_efficiency: float
    """Fraction of `cache_bytes` that shared KV may occupy."""
    step_overhead_s: float
    """Fixed seconds per engine step."""
    reuse_exponent: float = 1.0
    """How fast cache reuse falls off past capacity (the step model's h = (C / W) ** it)."""
    per_seq_overhead_s: float = 0.0
    """Extra seconds per scheduled sequence."""
    cache_read_cost: float = 0.0
    """Time of a KV read that hits the cache, as a fraction of one from memory: 0 = free, as
    on a GPU whose L2 bandwidth dwarfs HBM's; a CPU's L3 is only ~3x faster than its DRAM."""
    sequential_attention: bool = False
    """The attention kernel walks the batch's sequences in order (a CPU thread), so reuse
    depends on what was read since a block's last reader (see the step model)."""
    memory_bytes: float = 0.0
    """Device memory (HBM) in bytes; the simulator sizes the KV cache from it. 0 = unknown."""
    description: str = ""
    provenance: str = "estimate"
    """`measured`, `derived` or `estimate` (`PROVENANCES`): how far to trust its numbers. A
    profile file without it is an estimate; `feather probe` and `feather calibrate` write
    `measured` into the profiles they fit."""
    provenance_note: str = ""
    """Where the constants come from: the record, date, command and fit error (measured), the
    measured profile and why it transfers (derived), or what is assumed (estimate)."""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    _KIND: ClassVar[str] = "hardware"
    _CHECKS: ClassVar[_Checks] = {
        "mem_bandwidth_Bps": _positive,
        "peak_flops": _positive,
        "cache_bytes": _non_negative,
        "bandwidth_efficiency": _fraction,
        "compute_efficiency": _fraction,
        "cache_efficiency": _fraction0,
        "step_overhead_s": _non_negative,
        "reuse_exponent": _positive,
        "per_seq_overhead_s": _non_negative,
        "cache_read_cost": _fraction0,
        "sequential_attention": _boolean,
        "memory_bytes": _non_negative,
        "description": _text,
        "provenance": _provenance,
        "provenance_note": _text,
    }
    #: Fields ``feather calibrate`` fits against measured step times.
    FIT_FIELDS: ClassVar[tuple[str, ...]] = (
        "bandwidth_efficiency",
        "compute_efficiency",
        "cache_efficiency",
        "reuse_exponent",
        "step_overhead_s",
        "per_seq_overhead_s",
        "cache_read_cost",
    )

    def __post_init__(self) -> None:
        _validate(self, self._KIND, self._CHECKS)

    @property
    def effective_bandwidth_Bps(self) -> float:
        return self.mem_bandwidth_Bps * self.bandwidth_efficiency

    @property
    def effective_flops(self) -> float:
        return self.peak_flops * self.compute_efficiency

    @property
    def usable_cache_bytes(self) -> float:
        return self.cache_bytes * self.cache_efficiency

    @property
    def label(self) -> str:
        """`name (provenance)`, as bench headers and listings show a profile."""
        return f"{self.name} ({self.provenance})"

    def replace(self, **changes: Any) -> HardwareProfile:
        """A validated copy with some fields changed (e.g. fitted efficiencies)."""
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelProfile(_ProfileIO):
    """Architecture of a Llama-style decoder (RMSNorm, GQA attention, SwiGLU MLP).

    ``dtype_bytes`` is the weight element size; ``kv_dtype_bytes`` the KV-cache
    element size (defaults to ``dtype_bytes``; set 1 for an fp8 KV cache).

    Derived quantities (properties):

    - ``num_params``: all parameters, embedding and (untied) LM head included.
    - ``weight_bytes``: ``num_params * dtype_bytes`` (storage).
    - ``weight_bytes_per_step``: bytes of weights one forward pass streams. An untied
      input-embedding table is only gathered for the step's tokens, so it is left
      out; a tied table is read in full by the LM head, so it stays in.
    - ``flops_per_token``: ``2 * matmul_params``: every linear layer including the
      LM head, excluding the embedding lookup, norms and biases. The LM head is
      charged to every token (engines only compute logits for sampled positions, so
      this overcounts chunked prefill by ``vocab*hidden/matmul_params``, ~7% for
      Llama-3-8B; negligible next to the error of the efficiency factors).
    - ``attn_flops_per_pair``: FLOPs of one (query token, context token) pair summed
      over layers: QK^T and PV are each ``2 * num_heads * head_dim`` FLOPs.
    - ``kv_bytes_per_token_per_layer`` = ``2 * num_kv_heads * head_dim * kv_dtype_bytes``
      and ``kv_bytes_per_token`` = that times ``num_layers``.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: float
    kv_dtype_bytes: float | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_context_tokens: int = 0
    """Longest sequence (prompt + output) the model serves; 0 = unknown, not checked."""
    hf_repo: str = ""
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    _KIND: ClassVar[str] = "model"
    _CHECKS: ClassVar[_Checks] = {
        "num_layers": _positive_int,
        "hidden_size": _positive_int,
        "num_heads": _positive_int,
        "num_kv_heads": _positive_int,
        "head_dim": _positive_int,
        "intermediate_size": _positive_int,
        "vocab_size": _positive_int,
        "dtype_bytes": _positive,
        "kv_dtype_bytes": lambda v: None if v is None else _positive(v),
        "tie_word_embeddings": _boolean,
        "attention_bias": _boolean,
        "max_context_tokens": _non_negative_int,
        "hf_repo": _text,
        "description": _text,
    }

    def __post_init__(self) -> None:
        _validate(self, self._KIND, self._CHECKS)
        if self.num_heads % self.num_kv_heads:
            raise ProfileError(
                f"model profile {self.name!r}: field 'num_kv_heads' must divide num_heads "
                f"({self.num_heads}), got {self.num_kv_heads}"
            )

    def replace(self, **changes: Any) -> ModelProfile:
        """A validated copy with some fields changed (e.g. an fp8 KV cache)."""
        return dataclasses.replace(self, **changes)

    # -- parameter counts
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the q, k, v, o projections and the gate/up/down MLP matrices."""
        h = self.hidden_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        mlp = 3 * h * self.intermediate_size
        return attn + mlp

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        bias = (self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0
        norms = 2 * self.hidden_size
        per_layer = self.linear_params_per_layer + bias + norms
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return self.num_layers * per_layer + self.hidden_size + self.embedding_params + lm_head

    @property
    def matmul_params(self) -> int:
        """Parameters that take part in a GEMM per token (all linears + LM head)."""
        return self.num_layers * self.linear_params_per_layer + self.embedding_params

    # -- bytes and flops
    @property
    def kv_element_bytes(self) -> float:
        return self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes

    @property
    def weight_bytes_per_step(self) -> float:
        gathered_only = 0 if self.tie_word_embeddings else self.embedding_params
        return (self.num_params - gathered_only) * self.dtype_bytes

    @property
    def kv_bytes_per_token_per_layer(self) -> float:
        return 2 * self.kv_dim * self.kv_element_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return self.num_layers * self.kv_bytes_per_token_per_layer

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.matmul_params

    @property
    def attn_flops_per_pair(self) -> float:
        return 4.0 * self.num_layers * self.q_dim


# --------------------------------------------------------------------------- loading

_PROFILE_DIR = "profiles"


def _read_builtin(filename: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(_PROFILE_DIR).joinpath(filename).read_text("utf-8")
    data = json.loads(text)
    return data["profiles"]


@cache
def _builtin_hardware() -> dict[str, HardwareProfile]:
    raw = _read_builtin("hardware.json")
    return {
        k: HardwareProfile.from_dict(v, name=k, origin="built-in hardware.json")
        for k, v in raw.items()
    }


@cache
def _builtin_models() -> dict[str, ModelProfile]:
    raw = _read_builtin("models.json")
    return {
        k: ModelProfile.from_dict(v, name=k, origin="built-in models.json") for k, v in raw.items()
    }


def list_hardware() -> list[str]:
    """Names of the built-in hardware profiles."""
    return sorted(_builtin_hardware())


def list_models() -> list[str]:
    """Names of the built-in model profiles."""
    return sorted(_builtin_models())


def _looks_like_path(s: str) -> bool:
    return s.endswith(".json") or "/" in s or os.sep in s or Path(s).is_file()


def _load_file(cls: type, path: Path) -> Any:
    kind = cls._KIND
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"{kind} profile file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not valid JSON ({e})") from None
    if isinstance(data, dict) and "profiles" in data:
        profiles = data["profiles"]
        if not isinstance(profiles, dict) or len(profiles) != 1:
            raise ProfileError(
                f"{path}: a profile file must hold exactly one {kind} profile "
                f"(found {len(profiles) if isinstance(profiles, dict) else 'no'} under 'profiles')"
            )
        ((pname, pdata),) = profiles.items()
        return cls.from_dict(pdata, name=pname, origin=str(path))
    name = data.get("name") if isinstance(data, dict) else None
    return cls.from_dict(data, name=name or path.stem, origin=str(path))


def _load(name_or_path: str | os.PathLike[str], builtins: dict[str, Any], cls: type) -> Any:
    if isinstance(name_or_path, os.PathLike):
        return _load_file(cls, Path(name_or_path))
    if not isinstance(name_or_path, str):
        raise ProfileError(f"expected a {cls._KIND} profile name or path, got {name_or_path!r}")
    key = name_or_path.strip().lower()
    if key in builtins:
        return builtins[key]
    if _looks_like_path(name_or_path):
        return _load_file(cls, Path(name_or_path))
    raise ProfileError(
        f"unknown {cls._KIND} profile {name_or_path!r}; valid names: {', '.join(sorted(builtins))} "
        "(or pass a path to a JSON profile file)"
    )


def load_hardware(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """A built-in hardware profile by name (case-insensitive) or one read from a JSON file."""
    return _load(name_or_path, _builtin_hardware(), HardwareProfile)


def load_model(name_or_path: str | os.PathLike[str]) -> ModelProfile:
    """A built-in model profile by name (case-insensitive) or one read from a JSON file."""
    return _load(name_or_path, _builtin_models(), ModelProfile)
