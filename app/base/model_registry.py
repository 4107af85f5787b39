"""Architecture facts of well-known models, selected by a pod's ``model`` annotation.

The serving estimate needs more than a parameter count: the KV cache per token follows the layers,
the key/value heads and the head dimension (or, for multi-head latent attention, the latent size);
a mixture-of-experts decode step reads the shared layers once and only the experts a batch
touches. ``app/data/model_registry.yaml`` holds these facts for common families, each read from
the model's own configuration file (the entry names it). A pod without ``model`` falls back to the
size rule in ``app.serving.sizing`` (docs/stage-policy.md, "The serving model").
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.base.datafile import ParamCount, entries, parse_yaml, read_text

PACKAGE = "app.data"
RESOURCE = "model_registry.yaml"

PositiveInt = Annotated[int, Field(gt=0)]
_SEPARATORS = re.compile(r"[\s_./:]+")


class RegistryError(ValueError):
    """The registry file is unusable; the message names the entry and the field."""


def normalize(name: str) -> str:
    """Registry key: case-insensitive, ``/``, ``_``, ``.`` and spaces read as ``-``, and an
    ``org/`` prefix dropped, so ``meta-llama/Llama-3.1-70B`` finds ``llama-3.1-70b``."""
    text = name.strip().casefold()
    if "/" in text:
        text = text.rsplit("/", 1)[1]
    return _SEPARATORS.sub("-", text).strip("-")


class Mla(BaseModel):
    """Multi-head latent attention: the cache holds one compressed latent plus the rotary key."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kv_lora_rank: PositiveInt
    qk_rope_head_dim: PositiveInt


class Moe(BaseModel):
    """Mixture of experts: routed experts per MoE layer, how many a token takes, always-on ones."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    experts: PositiveInt
    top_k: PositiveInt
    shared_experts: int = Field(0, ge=0)
    expert_intermediate: PositiveInt
    dense_layers: int = Field(0, ge=0)  # leading layers with a dense MLP instead of experts

    @model_validator(mode="after")
    def _k_within(self) -> Moe:
        if self.top_k > self.experts:
            raise ValueError("top_k must be at most experts")
        return self


class ModelArch(BaseModel):
    """One model's facts. ``params`` and ``active_params`` as its card states them."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    name: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    params: ParamCount
    active_params: ParamCount | None = None
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    intermediate: PositiveInt | None = None
    vocab: PositiveInt | None = None
    attention: Literal["mha", "gqa", "mla"] = "gqa"
    mla: Mla | None = None
    moe: Moe | None = None
    source: str = Field(min_length=1)
    params_source: str | None = None
    notes: str | tuple[str, ...] | None = None

    @field_validator("aliases", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        if value is None:
            return ()
        return (value,) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> ModelArch:
        if not (math.isfinite(self.params) and self.params > 0):
            raise ValueError("params must be a positive parameter count")
        if self.active_params is not None and not 0 < self.active_params <= self.params:
            raise ValueError("active_params must be positive and at most params")
        if self.kv_heads > self.heads:
            raise ValueError("kv_heads must be at most heads")
        if (self.attention == "mla") != (self.mla is not None):
            raise ValueError("attention: mla needs an mla block, and an mla block needs attention: mla")
        return self

    @property
    def read_params(self) -> float:
        """Parameters one token's forward pass reads (the active ones for MoE)."""
        return self.active_params or self.params

    def kv_bytes_per_token(self, bytes_per_value: float = 2.0) -> float:
        """KV-cache bytes one token occupies across all layers."""
        if self.mla is not None:
            return self.layers * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * bytes_per_value
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_value

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (0 for dense models)."""
        return 0 if self.moe is None else max(self.layers - self.moe.dense_layers, 0)

    def expert_params(self) -> float:
        """Parameters of one routed expert summed over the MoE layers (0 for dense models)."""
        if self.moe is None:
            return 0.0
        return 3.0 * self.hidden * self.moe.expert_intermediate * self.moe_layers  # gate, up, down

    def params_read(self, tokens: int) -> float:
        """Expected parameters a decode step over ``tokens`` sequences reads.

        Dense: all of them. MoE: the shared part once, plus each routed expert with the probability
        that at least one of the batch's tokens routes to it (``1 - (1 - k/E)^b``, uniform routing).
        """
        if self.moe is None:
            return self.params
        per_expert = self.expert_params()
        routed = self.moe.experts * per_expert
        shared = max(self.params - routed, 0.0)
        share = self.moe.top_k / self.moe.experts
        touched = 1.0 - (1.0 - share) ** max(tokens, 1)
        return shared + routed * touched


class ModelRegistry:
    """Validated registry with lookup by name or alias."""

    def __init__(self, entries: Iterable[ModelArch], origin: str = "<registry>") -> None:
        self._entries = tuple(entries)
        self._index: dict[str, ModelArch] = {}
        for arch in self._entries:
            for key in (arch.name, *arch.aliases):
                owner = self._index.setdefault(normalize(key), arch)
                if owner is not arch:
                    raise RegistryError(f"{origin}: entry {arch.name!r}: {key!r} already names "
                                        f"entry {owner.name!r}")

    def __iter__(self) -> Iterator[ModelArch]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str) -> ModelArch | None:
        return self._index.get(normalize(name)) if isinstance(name, str) else None

    def by_counts(self, params: float, active_params: float | None, rel_tol: float) -> ModelArch | None:
        """The one mixture of experts whose total and active parameter counts both match within
        ``rel_tol``; None for dense counts (too many dense models share a size for the match to
        name one) or when the counts fit several entries of different architectures."""
        if active_params is None or not 0 < active_params < params:
            return None
        found = [a for a in self._entries if a.moe is not None and a.active_params is not None
                 and math.isclose(params, a.params, rel_tol=rel_tol)
                 and math.isclose(active_params, a.active_params, rel_tol=rel_tol)]
        shapes = {(a.layers, a.hidden, a.kv_bytes_per_token(), a.moe, a.mla) for a in found}
        return found[0] if len(shapes) == 1 else None

    def nearest(self, name: str) -> str | None:
        """The known name closest to ``name``, for "did you mean" messages."""
        names = [a.name for a in self._entries]
        close = difflib.get_close_matches(normalize(name), names, n=1, cutoff=0.0)
        return close[0] if close else None

    @classmethod
    def load(cls, path: Path | None = None) -> ModelRegistry:
        text, origin = read_text(path, PACKAGE, RESOURCE, RegistryError)
        return cls.from_data(parse_yaml(text, origin, RegistryError), origin)

    @classmethod
    def from_data(cls, data: Any, origin: str = "<registry>") -> ModelRegistry:
        raw = data.get("models") if isinstance(data, dict) else data
        if not isinstance(raw, list):
            raise RegistryError(f"{origin}: expected a 'models' list of entries")
        return cls(entries(raw, ModelArch, RegistryError, origin, "name"), origin)


@functools.cache
def default_registry() -> ModelRegistry:
    """The packaged registry, loaded once per process."""
    return ModelRegistry.load()
