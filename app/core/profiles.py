"""Measured serving profiles: what a team benchmarked, in place of the serving model's estimates.

"Profile first": a model served on a given GPU at a given precision has a measured ms per output
token, time to first token and the most sequences it serves within them. When the settings name a
profiles file (``profiles_file``), a serving pod that matches an entry (same ``model-params`` and
``active-params``, GPU product, GPU count and precision) is judged by the measurement instead of
``app.core.sizing``'s estimate, and explain says which of the two each figure is
(docs/stage-policy.md, "Measured profiles").

The file is YAML or JSON (JSON is YAML), validated completely at start: a bad entry fails the
configuration with the entry and the field named, like the GPU catalog.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.core.catalog import GpuCatalog, GpuSpec
from app.core.datafile import entries
from app.core.units import parse_param_count
from app.core.workload import Precision, WorkloadSpec

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(gt=0)]
# "8B" in a profile and "8.03B" on a pod (a model card's exact count) are the same model.
PARAMS_REL_TOLERANCE = 0.01


class ProfileError(ValueError):
    """The profiles file is unusable; the message names the entry and the field."""


class Profile(BaseModel):
    """One measurement: a model on ``gpus`` GPUs of one product at one precision."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    model: str = Field(min_length=1)  # a name for people and explain, e.g. llama-3.1-8b-instruct
    model_params: float
    active_params: float | None = None
    gpu: str = Field(min_length=1)  # catalog name or any alias: H100-SXM-80GB, NVIDIA-L4, L4
    gpus: PositiveInt = 1
    precision: Precision
    ms_per_token: PositiveFloat | None = None  # decode, per output token, at max_concurrency
    ttft_ms: PositiveFloat | None = None  # time to first token
    prompt_tokens: PositiveInt | None = None  # the prompt length ttft_ms was measured at
    max_concurrency: PositiveInt | None = None  # sequences served at once within those figures
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
        if not (self.model_params > 0 and math.isfinite(self.model_params)):
            raise ValueError("model_params must be a positive parameter count")
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


class ProfileBook:
    """Validated profiles with lookup by (pod, GPU product, precision)."""

    def __init__(self, entries: Iterable[Profile], origin: str = "<profiles>",
                 catalog: GpuCatalog | None = None) -> None:
        self.entries = tuple(entries)
        self.origin = origin
        # Indexed by (catalog GPU, GPU count, precision): a lookup per node per filter stays O(1)
        # however many entries the file has (model sizes are then matched with a tolerance).
        self._index: dict[tuple[str, int, Precision, int], list[Profile]] = {}
        catalog = catalog or GpuCatalog.load()
        for i, p in enumerate(self.entries):
            spec = catalog.lookup(p.gpu)
            if spec is None:
                raise ProfileError(f"{origin}: entry #{i + 1} ({p.model}): GPU {p.gpu!r} is not in the "
                                   "catalog; use its catalog name or an alias (llm-placement catalog)")
            twin = self._find(spec.name, p.gpus, p.precision, p.model_params, p.active_params)
            if twin is not None and _figures(twin) != _figures(p):
                raise ProfileError(
                    f"{origin}: entry #{i + 1} ({p.model}) measures the same model, GPU {spec.name} x "
                    f"{p.gpus} and precision {p.precision.value} as an earlier entry ({twin.model}) "
                    "with other figures; keep one")
            if twin is None:
                key = (spec.name, p.gpus, p.precision, _bucket(p.model_params))
                self._index.setdefault(key, []).append(p)

    def _find(self, gpu: str, gpus: int, precision: Precision, params: float,
              active: float | None) -> Profile | None:
        b = _bucket(params)
        for near in (b, b - 1, b + 1):  # within the tolerance means at most one bucket away
            for p in self._index.get((gpu, gpus, precision, near), ()):
                if _close(p.model_params, params) and _close(p.active_params, active):
                    return p
        return None

    @classmethod
    def load(cls, path: str | Path) -> ProfileBook:
        origin = str(path)
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ProfileError(f"{origin}: cannot read: {exc}") from exc
        except yaml.YAMLError as exc:
            raise ProfileError(f"{origin}: not valid YAML or JSON: {exc}") from exc
        return cls.from_data(data, origin)

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
        if spec.model_params is None:
            return None
        return self._find(gpu.name, spec.gpus, precision, spec.model_params, spec.active_params)


def _bucket(params: float) -> int:
    """Buckets one tolerance wide on a log scale, so close model sizes are neighbours."""
    return math.floor(math.log(params) / -math.log1p(-PARAMS_REL_TOLERANCE))


def _figures(p: Profile) -> tuple[object, ...]:
    return (p.ms_per_token, p.ttft_ms, p.prompt_tokens, p.max_concurrency)
