"""Measured serving profiles: what a team benchmarked, in place of the serving model's estimates.

"Profile first": a model served on a given GPU at a given precision has a measured ms per output
token, time to first token and the most sequences it serves within them. When the settings name a
profiles file (``profiles_file``), a serving pod that matches an entry (same ``model-params`` and
``active-params``, GPU product, GPU count and precision) is judged by the measurement instead of
``app.serving.sizing``'s estimate, and explain says which of the two each figure is
(docs/stage-policy.md, "Measured profiles").

The file is YAML or JSON (JSON is YAML), validated completely at start: a bad entry fails the
configuration with the entry and the field named, like the GPU catalog.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.base.catalog import GpuCatalog, GpuSpec, default_catalog
from app.base.datafile import entries
from app.base.units import parse_param_count
from app.base.userfiles import (
    MAX_ROW_CLIENTS,
    MAX_ROW_GPUS,
    MAX_ROW_MS_PER_TOKEN,
    MAX_ROW_PARAMS,
    MAX_ROW_TOKENS,
    MAX_ROW_TTFT_MS,
    parse_user_yaml,
    read_user_text,
)
from app.base.workload import Precision, WorkloadSpec

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(gt=0)]
# "8B" in a profile and "8.03B" on a pod (a model card's exact count) are the same model.
PARAMS_REL_TOLERANCE = 0.01


MAX_FILE_BYTES = 64 << 20  # 200,000 entries of JSON are about 40 MB


class ProfileError(ValueError):
    """The profiles file is unusable; the message names the entry and the field."""


class Profile(BaseModel):
    """One measurement: a model on ``gpus`` GPUs of one product at one precision."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    model: str = Field(min_length=1)  # a name for people and explain, e.g. llama-3.1-8b-instruct
    model_params: float
    active_params: float | None = None
    gpu: str = Field(min_length=1)  # catalog name or any alias: H100-SXM-80GB, NVIDIA-L4, L4
    # Physical bounds: app/base/userfiles.py, docs/stage-policy.md "Limits of user files".
    gpus: Annotated[int, Field(gt=0, le=MAX_ROW_GPUS)] = 1
    precision: Precision
    # decode, per output token, at max_concurrency
    ms_per_token: Annotated[float, Field(gt=0, le=MAX_ROW_MS_PER_TOKEN, allow_inf_nan=False)] | None = None
    ttft_ms: Annotated[float, Field(gt=0, le=MAX_ROW_TTFT_MS, allow_inf_nan=False)] | None = None
    # the prompt length ttft_ms was measured at
    prompt_tokens: Annotated[int, Field(gt=0, le=MAX_ROW_TOKENS)] | None = None
    # sequences served at once within those figures
    max_concurrency: Annotated[int, Field(gt=0, le=MAX_ROW_CLIENTS)] | None = None
    source: str = ""  # how it was measured (tool, date), shown in explain

    @field_validator("model_params", "active_params", mode="before")
    @classmethod
    def _params(cls, value: object) -> object:
        if isinstance(value, str):
            return parse_param_count(value)
        return value

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _says_something(self) -> Profile:
        if not (0 < self.model_params <= MAX_ROW_PARAMS and math.isfinite(self.model_params)):
            raise ValueError(f"model_params must be a positive parameter count, at most {MAX_ROW_PARAMS:.0e}")
        if self.active_params is not None and not 0 < self.active_params <= self.model_params:
            raise ValueError("active_params must be positive and at most model_params")
        if self.ms_per_token is None and self.ttft_ms is None and self.max_concurrency is None:
            raise ValueError("give at least one of ms_per_token, ttft_ms, max_concurrency")
        return self

    def ttft_for(self, prompt_tokens: int) -> float | None:
        """Time to first token at ``prompt_tokens``: measured, scaled linearly (prefill is
        compute-bound, ~2 FLOPs per parameter per token) when measured at another length."""
        if self.ttft_ms is None:
            return None
        if self.prompt_tokens is None or self.prompt_tokens == prompt_tokens:
            return self.ttft_ms
        return self.ttft_ms * prompt_tokens / self.prompt_tokens


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=PARAMS_REL_TOLERANCE)


# Sizes are indexed by band: log(params) in steps of log(1 + tolerance), so a pod's size and every
# entry it may match are at most one band apart, and a lookup reads three bands (nine with
# active_params) instead of scanning every entry.
_BAND = math.log1p(PARAMS_REL_TOLERANCE)
# The widest log-distance _close accepts (|a - b| <= tol x max(a, b)), a hair over one band: a
# match reads two bands either side.
_MATCH = -math.log1p(-PARAMS_REL_TOLERANCE)
_MATCH_BANDS = 2
# Two entries one pod could both match (sizes up to twice _MATCH apart, so at most three bands) are
# a conflict unless they measured the same figures: which one a pod got would depend on file order.
_CONFLICT_BANDS = 3
FIGURES = ("ms_per_token", "ttft_ms", "prompt_tokens", "max_concurrency")
Slot = tuple[str, int, Precision]  # catalog GPU name, GPU count, precision


def _band(params: float) -> int:
    return math.floor(math.log(params) / _BAND)


def _overlap(a: float | None, b: float | None) -> bool:
    """Some pod's size is close (``_close``) to both: a is None and b is None, or within 2 x _MATCH."""
    if a is None or b is None:
        return a is None and b is None
    return abs(math.log(a / b)) <= 2 * _MATCH


def same_slot(a: Profile, b: Profile, catalog: GpuCatalog | None = None) -> bool:
    """Whether one pod could match both entries: same GPU product (any alias), count and precision,
    sizes close enough (the rule the profiles file is checked by)."""
    catalog = catalog or default_catalog()
    gpu_a, gpu_b = catalog.lookup(a.gpu), catalog.lookup(b.gpu)
    return (gpu_a is not None and gpu_b is not None and gpu_a.name == gpu_b.name and a.gpus == b.gpus
            and a.precision is b.precision and _overlap(a.model_params, b.model_params)
            and _overlap(a.active_params, b.active_params))


def _label(i: int, p: Profile) -> str:
    return f"entry #{i + 1} ({p.model})"


class ProfileSource(Protocol):
    """Where serving profiles are looked up: a file of measurements (``ProfileBook``), or those
    learnt from the engines' metrics in front of it (``app.serving.live_profiles.LiveProfileBook``)."""

    def match(self, spec: WorkloadSpec, gpu: GpuSpec, precision: Precision) -> Profile | None: ...


class ProfileBook:
    """Validated profiles, indexed by (GPU, count, precision, size band) for O(1) matching.

    Every entry names a GPU of the catalog (an unknown one could never match a node, so it is a
    typo), and no two entries a pod could both match disagree: both refused at load, naming the entry.
    """

    def __init__(self, entries: Iterable[Profile], origin: str = "<profiles>",
                 catalog: GpuCatalog | None = None) -> None:
        self.entries = tuple(entries)
        self.origin = origin
        catalog = catalog or default_catalog()
        # slot -> (size band, active-size band) -> entries, in file order
        self._index: dict[Slot, dict[tuple[int, int | None], list[tuple[int, Profile]]]] = {}
        gpu_names: dict[str, str | None] = {}  # a file repeats a handful of GPU spellings
        for i, p in enumerate(self.entries):
            if p.gpu not in gpu_names:
                gpu = catalog.lookup(p.gpu)
                gpu_names[p.gpu] = gpu.name if gpu is not None else None
            name = gpu_names[p.gpu]
            if name is None:
                raise ProfileError(f"{origin}: {_label(i, p)}: gpu {p.gpu!r} is not in the GPU catalog "
                                   "(llm-placement catalog lists them)")
            self._add((name, p.gpus, p.precision), i, p)

    def _add(self, slot: Slot, i: int, p: Profile) -> None:
        for j, other in self._candidates(slot, p.model_params, p.active_params, _CONFLICT_BANDS):
            same_size = (_overlap(other.model_params, p.model_params)
                         and _overlap(other.active_params, p.active_params))
            if same_size and any(getattr(other, f) != getattr(p, f) for f in FIGURES):
                raise ProfileError(
                    f"{self.origin}: {_label(i, p)}: same GPU ({p.gpu} x{p.gpus}), precision and size "
                    f"(within {2 * PARAMS_REL_TOLERANCE:.0%}) as {_label(j, other)} with other figures; "
                    "a pod would match both: keep one")
        bands = (_band(p.model_params), None if p.active_params is None else _band(p.active_params))
        self._index.setdefault(slot, {}).setdefault(bands, []).append((i, p))

    def _candidates(self, slot: Slot, params: float, active: float | None, reach: int
                    ) -> list[tuple[int, Profile]]:
        """Entries of ``slot`` within ``reach`` bands of the sizes: a fixed number of dict reads."""
        by_band = self._index.get(slot)
        if not by_band:
            return []
        base = _band(params)
        act = None if active is None else _band(active)
        actives = (None,) if act is None else range(act - reach, act + reach + 1)
        out: list[tuple[int, Profile]] = []
        for b in range(base - reach, base + reach + 1):
            for a in actives:
                if (hit := by_band.get((b, a))) is not None:
                    out.extend(hit)
        return out

    @classmethod
    def load(cls, path: str | Path) -> ProfileBook:
        origin = str(path)
        return cls.from_data(_parse(read_user_text(path, ProfileError, MAX_FILE_BYTES), origin), origin)

    @classmethod
    def from_data(cls, data: Any, origin: str = "<profiles>") -> ProfileBook:
        """A mapping with a ``profiles`` list (or the bare list)."""
        raw = data.get("profiles") if isinstance(data, dict) else data
        if not isinstance(raw, list):
            raise ProfileError(f"{origin}: expected a 'profiles' list of entries")
        out = entries(raw, Profile, ProfileError, origin, "model")
        return cls(out, origin)

    def match(self, spec: WorkloadSpec, gpu: GpuSpec, precision: Precision) -> Profile | None:
        """The entry measured for this model, on this GPU product and count, at ``precision``."""
        if spec.model_params is None or spec.model_params <= 0:
            return None
        found = [(i, p) for i, p in self._candidates((gpu.name, spec.gpus, precision), spec.model_params,
                                                    spec.active_params, _MATCH_BANDS)
                 if _close(p.model_params, spec.model_params) and _close(p.active_params, spec.active_params)]
        return min(found, key=lambda ip: ip[0])[1] if found else None  # the file's first, as before


def _parse(text: str, origin: str) -> Any:
    """JSON through orjson (200,000 entries in a second, where a YAML parser takes minutes), anything
    else (or JSON orjson refuses) as YAML, with the C parser when PyYAML has it."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass  # maybe YAML flow style: the YAML parser says what is wrong
    return parse_user_yaml(text, origin, ProfileError)
