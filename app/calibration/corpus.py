"""Measurement files: published (or a user's own) serving measurements, validated row by row.

The format is the corpus's (``app/data/measurements/README.md``): a ``source`` block and a list of
``points``. A bad file is refused with the file, the row and the field named, never half read:
calibrating against a silently dropped or misread row would move every estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from app.base.catalog import GpuCatalog, GpuSpec, default_catalog
from app.base.datafile import ParamCount, problems
from app.base.model_registry import ModelArch, ModelRegistry, default_registry
from app.base.userfiles import (
    MAX_ROW_CLIENTS,
    MAX_ROW_GPUS,
    MAX_ROW_MS_PER_TOKEN,
    MAX_ROW_PARAMS,
    MAX_ROW_REQUESTS,
    MAX_ROW_THROUGHPUT,
    MAX_ROW_TOKENS,
    MAX_ROW_TTFT_MS,
    parse_user_yaml,
    read_user_text,
)
from app.base.workload import Precision
from app.serving.model import Case, Shape, engine_name

PACKAGE = "app.data"
FOLDER = "measurements"
MAX_FILE_BYTES = 4 << 20  # a measurement file is a table, not a dump
MAX_VALUES = 1 << 20  # YAML values in one file (about 50,000 rows of 20 fields)

# Physical bounds (app/base/userfiles.py, docs/stage-policy.md "Limits of user files").
Gpus = Annotated[int, Field(gt=0, le=MAX_ROW_GPUS)]
Clients = Annotated[int, Field(gt=0, le=MAX_ROW_CLIENTS)]
Requests = Annotated[int, Field(gt=0, le=MAX_ROW_REQUESTS)]
Tokens = Annotated[int, Field(gt=0, le=MAX_ROW_TOKENS)]
MsPerToken = Annotated[float, Field(gt=0, le=MAX_ROW_MS_PER_TOKEN, allow_inf_nan=False)]
TtftMs = Annotated[float, Field(gt=0, le=MAX_ROW_TTFT_MS, allow_inf_nan=False)]
TokensPerSecond = Annotated[float, Field(gt=0, le=MAX_ROW_THROUGHPUT, allow_inf_nan=False)]


class CorpusError(ValueError):
    """A measurement file is unusable; the message names the file, the row and the field."""


class Source(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    id: str = Field(min_length=1, max_length=200)
    title: str = Field(min_length=1)
    url: str = Field(min_length=1)
    publisher: str = ""
    kind: str = ""


class Point(BaseModel):
    """One measured configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    locator: str = Field(min_length=1)
    engine: str = Field(min_length=1)
    engine_version: str = "unstated"
    model: str = Field(min_length=1)
    model_params: ParamCount | None = None
    active_params: ParamCount | None = None
    precision: Precision
    kv_precision: Literal["fp8", "bf16", "fp16", "fp32", "int8"] | None = None
    gpu: str = Field(min_length=1)
    gpus: Gpus
    tp: Gpus = 1
    ep: Gpus | None = None
    pp: Gpus = 1
    concurrency: Clients
    # closed-loop: `concurrency` clients, each sending its next request when the last ends
    # (continuous batching sees prompts arrive while others decode); static: one batch submitted
    # at once, every prompt first, then decode together (a fixed-batch profile).
    load: Literal["closed-loop", "static"] = "closed-loop"
    # How a closed loop's prompts arrive. together: like requests (fixed lengths) finish in the
    # same step and their clients send the next prompts at once, round after round. staggered:
    # request lengths drawn from a range, so only the first round arrives together and the
    # clients drift apart after it; `requests` (how many the figures average over) says what
    # share of them that first round is.
    arrival: Literal["together", "staggered"] = "together"
    requests: Requests | None = None
    input_tokens: Tokens
    output_tokens: Tokens
    tpot_ms: MsPerToken | None = None
    # e2e: whole-request latency / output tokens, prompt included (a latency benchmark's only figure)
    tpot_stat: Literal["mean", "median", "p50", "derived", "e2e"] | None = None
    ttft_ms: TtftMs | None = None
    throughput_tok_s: TokensPerSecond | None = None
    notes: str | None = ""

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("engine_version", mode="before")
    @classmethod
    def _version(cls, value: object) -> object:
        return str(value) if isinstance(value, int | float) else value

    @model_validator(mode="after")
    def _useful(self) -> Point:
        for name in ("model_params", "active_params"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and 0 < value <= MAX_ROW_PARAMS):
                raise ValueError(f"{name} must be a positive parameter count, at most {MAX_ROW_PARAMS:.0e}")
        if self.arrival == "staggered" and (self.requests is None or self.requests < self.concurrency):
            raise ValueError("arrival: staggered needs requests, at least concurrency (requests measured)")
        if self.tpot_ms is None and self.ttft_ms is None:
            raise ValueError("give tpot_ms or ttft_ms (a throughput alone does not calibrate latency)")
        return self


class Measurement(BaseModel):
    """A point joined to its source, its GPU's catalog entry and its model's facts."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    source: Source
    point: Point
    gpu: GpuSpec
    arch: ModelArch | None
    params: float
    active_params: float | None
    file: str

    @property
    def moe(self) -> bool:
        return self.active_params is not None and self.active_params < self.params

    def case(self) -> Case:
        p = self.point
        return Case(Shape.of(self.params, self.active_params, self.arch), p.precision, self.gpu, p.gpus,
                    p.concurrency, p.input_tokens, p.output_tokens,
                    kv_bytes_per_value=1.0 if p.kv_precision in ("fp8", "int8") else 2.0,
                    static=p.load == "static",
                    together_share=p.concurrency / p.requests if p.arrival == "staggered" and p.requests
                    else 1.0, engine=engine_name(p.engine))


def load_file(path: Path | str, *, text: str | None = None, catalog: GpuCatalog | None = None,
              registry: ModelRegistry | None = None) -> list[Measurement]:
    """Every point of one file, or a ``CorpusError`` naming the first bad row and field."""
    origin = str(path)
    catalog = catalog or default_catalog()
    registry = registry or default_registry()
    # One reader for every user file (app/base/userfiles.py): a regular file, the size counted
    # while reading, no NUL, UTF-8, no aliases, nesting capped.
    if text is None:
        text = read_user_text(path, CorpusError, MAX_FILE_BYTES)
    data = parse_user_yaml(text, origin, CorpusError, max_nodes=MAX_VALUES)
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise CorpusError(f"{origin}: expected a 'source' mapping and a 'points' list")
    try:
        source = Source.model_validate(data.get("source"))
    except ValidationError as exc:
        raise CorpusError(f"{origin}: source: {problems(exc)}") from None
    out = []
    for i, raw in enumerate(data["points"]):
        row = f"{origin}: point #{i + 1}"
        if not isinstance(raw, dict):
            raise CorpusError(f"{row}: expected a mapping of fields")
        try:
            point = Point.model_validate(raw)
        except ValidationError as exc:
            raise CorpusError(f"{row}: {problems(exc)}") from None
        gpu = catalog.lookup(point.gpu)
        if gpu is None:
            raise CorpusError(f"{row}: field 'gpu': {point.gpu!r} is not in the GPU catalog")
        arch = registry.get(point.model)
        params = point.model_params or (arch.params if arch else None)
        if params is None:
            hint = registry.nearest(point.model)
            raise CorpusError(f"{row}: field 'model': {point.model!r} is not in the model registry "
                              f"(nearest: {hint}) and the row gives no model_params")
        active = point.active_params or (arch.active_params if arch else None)
        if active is not None and active > params:
            raise CorpusError(f"{row}: field 'active_params': {active:.4g} active parameters, more than "
                              f"the model's {params:.4g} in all")
        out.append(Measurement(source=source, point=point, gpu=gpu, arch=arch, params=params,
                               active_params=active, file=origin))
    return out


def load(paths: Iterable[Path | str]) -> list[Measurement]:
    """Files and folders (every ``*.yaml``/``*.yml``/``*.json`` inside), in a stable order."""
    out: list[Measurement] = []
    owners: dict[str, str] = {}  # source id -> file: leave-one-source-out needs them distinct
    for path in paths:
        p = Path(path)
        targets = (sorted(q for q in p.iterdir() if q.suffix in (".yaml", ".yml", ".json"))
                   if p.is_dir() else [p])
        for target in targets:
            got = load_file(target)
            if got and owners.setdefault(got[0].source.id, str(target)) != str(target):
                raise CorpusError(f"{target}: source id {got[0].source.id!r} is also used by "
                                  f"{owners[got[0].source.id]}")
            out.extend(got)
    return out


def packaged_folder() -> Path:
    return Path(str(files(PACKAGE).joinpath(FOLDER)))


def packaged() -> list[Measurement]:
    """The corpus shipped with the product."""
    return load([packaged_folder()])


def summary(rows: list[Measurement]) -> dict[str, Any]:
    return {"points": len(rows), "sources": len({m.source.id for m in rows}),
            "gpus": sorted({m.gpu.name for m in rows}),
            "precisions": sorted({m.point.precision.value for m in rows})}
