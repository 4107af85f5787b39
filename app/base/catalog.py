"""The built-in GPU catalog: hardware facts per GPU product, joined to node labels by alias.

The catalog is a YAML file shipped in ``app.data`` (``gpu_catalog.yaml``). ``GpuCatalog.load``
validates it completely (positive numbers, unique names, aliases unique across entries even after
normalisation) and fails with a ``CatalogError`` naming the entry and the field.

``GpuCatalog.lookup`` maps a node label value (GPU Feature Discovery ``nvidia.com/gpu.product``,
GKE ``cloud.google.com/gke-accelerator``, ...) to a ``GpuSpec``. It is deliberately conservative:
only an exact alias (ignoring case and ``-``/``_``/space differences, and GFD's ``-SHARED``
suffix) matches. MIG slices and anything unknown return ``None``; it never guesses a bigger GPU.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Hashable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from app.base.datafile import parse_yaml, read_text

PACKAGE = "app.data"
RESOURCE = "gpu_catalog.yaml"

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_SEPARATORS = re.compile(r"[\s_\-]+")
_MIG_PROFILE = re.compile(r"^\d+g\.\d+gb$")  # e.g. 1g.5gb, 3g.40gb
_SHARED_SUFFIX = "-shared"


class CatalogError(ValueError):
    """The GPU catalog file is unusable; the message names the entry and the field."""


class GpuSpec(BaseModel):
    """Hardware facts for one GPU product, per GPU (never per box)."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    name: str = Field(min_length=1)
    vendor: Literal["nvidia", "amd", "intel"]
    memory_gb: PositiveFloat  # as marketed, decimal GB
    hbm_bandwidth_tbs: PositiveFloat
    bf16_tflops: PositiveFloat  # dense; FP16 where the part has no BF16 (see notes)
    int8_tops: PositiveFloat | None = None  # dense; None where no public source gives it (see notes)
    interconnect: str = Field(min_length=1)
    nvlink: StrictBool  # NVLink/xGMI reaches every GPU in the box
    fp8: StrictBool = False  # FP8 tensor cores (W8A8)
    # Without FP8 tensor cores, fp8 checkpoints still run as weight-only W8A16 (FP8 Marlin kernels)
    # on compute capability 7.5 and newer: vLLM docs, features/quantization/fp8.
    fp8_weight_only: StrictBool = False
    # Memory as the driver reports it (nvidia-smi memory.total, GFD nvidia.com/gpu.memory), MiB:
    # what a node without that label really offers, rather than the marketed decimal GB.
    memory_mib: PositiveFloat | None = None
    # CUDA compute capability ("9.0"), as NVIDIA's compute capability tables list it: matched to GPU
    # Feature Discovery's labels to bound the throughput of a product the catalog lacks.
    compute_capability: str | None = Field(None, pattern=r"^\d+\.\d+$")
    # Representative on-demand list price per GPU-hour; None where no public list price was found
    # (see notes): such a node is priced like an unknown GPU (unknown_gpu_hourly_cost) unless annotated.
    hourly_cost_usd: PositiveFloat | None = None
    source: tuple[str, ...] = Field(min_length=1)
    aliases: tuple[str, ...] = Field(min_length=1)
    notes: tuple[str, ...] = ()

    @field_validator("source", "aliases", "notes", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("source")
    @classmethod
    def _urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not url.startswith("https://") or any(c.isspace() for c in url):
                raise ValueError(f"{url!r} is not an https:// URL")
        return value

    @field_validator("aliases")
    @classmethod
    def _usable_aliases(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for alias in value:
            key = normalize(alias)
            if not key:
                raise ValueError(f"alias {alias!r} is empty")
            if key.endswith(_SHARED_SUFFIX):
                raise ValueError(f"alias {alias!r} ends in -SHARED, which lookup strips")
            if _is_mig(key):
                raise ValueError(f"alias {alias!r} names a MIG slice, which never matches")
        return value


def normalize(label_value: str) -> str:
    """Case-fold and collapse runs of ``-``, ``_`` and whitespace to a single ``-``."""
    return _SEPARATORS.sub("-", label_value.strip().casefold()).strip("-")


def _is_mig(key: str) -> bool:
    return any(tok == "mig" or _MIG_PROFILE.match(tok) for tok in key.split("-"))


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated inside one mapping (PyYAML keeps the last silently)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Hashable, Any]:
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise CatalogError(f"line {key_node.start_mark.line + 1}: key {key!r} appears twice")
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class GpuCatalog:
    """Validated, immutable set of ``GpuSpec`` entries with label lookup."""

    def __init__(self, entries: Iterable[GpuSpec], origin: str = "<catalog>") -> None:
        self._entries = tuple(entries)
        self._by_name: dict[str, GpuSpec] = {}
        self._exact: dict[str, GpuSpec] = {}
        self._normalized: dict[str, GpuSpec] = {}
        for spec in self._entries:
            if spec.name.casefold() in self._by_name:
                raise CatalogError(f"{origin}: entry {spec.name!r}: field 'name': duplicate name")
            self._by_name[spec.name.casefold()] = spec
        for spec in self._entries:
            for key in (spec.name, *spec.aliases):
                field = "name" if key == spec.name else "aliases"
                self._claim(self._exact, key.strip().casefold(), spec, key, field, origin)
                self._claim(self._normalized, normalize(key), spec, key, field, origin)

    @staticmethod
    def _claim(index: dict[str, GpuSpec], key: str, spec: GpuSpec, raw: str, field: str, origin: str) -> None:
        owner = index.setdefault(key, spec)
        if owner is not spec:
            raise CatalogError(
                f"{origin}: entry {spec.name!r}: field {field!r}: {raw!r} already identifies "
                f"entry {owner.name!r}"
            )

    @classmethod
    def load(cls, path: Path | None = None) -> GpuCatalog:
        """Read and validate a catalog file; the packaged ``app.data`` catalog when ``path`` is None."""
        text, origin = read_text(path, PACKAGE, RESOURCE, CatalogError)
        return cls.from_data(parse_yaml(text, origin, CatalogError, _UniqueKeyLoader), origin)

    @classmethod
    def from_data(cls, data: object, origin: str = "<catalog>") -> GpuCatalog:
        """Validate already-parsed data: a mapping with a ``gpus`` list (or the bare list)."""
        raw = data.get("gpus") if isinstance(data, dict) else data
        if not isinstance(raw, list) or not raw:
            raise CatalogError(f"{origin}: expected a non-empty 'gpus' list of entries")
        specs = []
        for i, item in enumerate(raw):
            label = f"#{i + 1}"
            if isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"].strip():
                label = repr(item["name"].strip())
            if not isinstance(item, dict):
                raise CatalogError(f"{origin}: entry {label}: expected a mapping of fields")
            try:
                specs.append(GpuSpec.model_validate(item))
            except ValidationError as exc:
                problems = "; ".join(
                    f"field {'.'.join(str(p) for p in err['loc']) or '?'!r}: {err['msg']}"
                    for err in exc.errors()
                )
                raise CatalogError(f"{origin}: entry {label}: {problems}") from None
        return cls(specs, origin)

    @property
    def entries(self) -> list[GpuSpec]:
        """All entries in file order (a copy)."""
        return list(self._entries)

    def __iter__(self) -> Iterator[GpuSpec]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def by_name(self, name: str) -> GpuSpec | None:
        """The entry with this canonical name (case-insensitive), else None."""
        return self._by_name.get(name.strip().casefold())

    def lookup(self, label_value: str) -> GpuSpec | None:
        """The entry a node label value denotes, or None (unknown product or a MIG slice).

        Never raises. A trailing ``-SHARED`` (GFD time-slicing/MPS rename) is ignored; separators
        and case are normalised; nothing else is inferred.
        """
        if not isinstance(label_value, str):
            return None
        key = normalize(label_value)
        if key.endswith(_SHARED_SUFFIX):
            key = key[: -len(_SHARED_SUFFIX)].rstrip("-")
        if not key or _is_mig(key):
            return None
        exact = label_value.strip().casefold()
        if exact.endswith(_SHARED_SUFFIX):
            exact = exact[: -len(_SHARED_SUFFIX)]
        return self._exact.get(exact) or self._normalized.get(key)


@functools.cache
def default_catalog() -> GpuCatalog:
    """The packaged catalog, loaded once per process."""
    return GpuCatalog.load()
