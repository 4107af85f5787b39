"""Node objects from a cluster file: the demo's compact ``groups`` format (app/demo/cluster.yaml), or
Node objects as ``kubectl get nodes -o yaml`` prints them (a List with ``items``); and the planner's own
link speeds, ``bandwidth_gbps`` (docs/planner.md, "Cluster file")."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.base.objects import expand_cluster, load_yaml
from app.config.policy import TierBandwidth
from app.plan.files import CLUSTER_MAX_BYTES, CLUSTER_MAX_ITEMS, read_cluster_file

MAX_FILE_BYTES = CLUSTER_MAX_BYTES  # kubectl get nodes -o yaml of a 5,000-node cluster fits
MAX_NODES = CLUSTER_MAX_ITEMS
TOP_KEYS = ("groups", "items", "apiVersion", "kind", "metadata", "bandwidth_gbps")


class ClusterFileError(ValueError):
    """The cluster file is unusable; the message names the group or item and the field."""


class Group(BaseModel):
    """One group of identical nodes in the demo format (app/demo/cluster.yaml): every field
    ``expand_cluster`` reads, and no other (``gpu: 8`` for ``gpus: 8`` is refused, not ignored)."""

    model_config = ConfigDict(extra="forbid")

    prefix: str = Field(min_length=1, max_length=200, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    count: int = Field(1, ge=1, le=MAX_NODES)
    gpus: int = Field(0, ge=0, le=64)
    product: str | None = Field(None, max_length=200)
    cpu: str | int | float = "96"
    memory: str = "1024Gi"
    labels: dict[str, str] = Field(default_factory=dict, max_length=200)
    annotations: dict[str, str] = Field(default_factory=dict, max_length=200)
    rdma: bool = False
    node_class: str | None = None

    @field_validator("labels", "annotations", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        # A label written `true` or `2` is the text "true" or "2", as Kubernetes stores it.
        if isinstance(v, dict):
            return {k: (str(x).lower() if isinstance(x, bool) else str(x)) for k, x in v.items()}
        return v


def _speed(v: Any) -> Any:
    """GB/s, or "inf" (.inf in YAML): a transfer that costs no time."""
    if isinstance(v, str) and v.strip().lower() in ("inf", ".inf", "infinity"):
        return math.inf
    return v


class Bandwidth(BaseModel):
    """The planner's link speeds, GB/s per rung of the data-gravity ladder (docs/data-gravity.md),
    without the extender's floor and cap: ``.inf`` makes a rung free (a local read costing nothing,
    as the published scheduling examples state it). Rungs not given keep the settings' values."""

    model_config = ConfigDict(extra="forbid")

    same_node: float | None = None
    same_nvlink_domain: float | None = None
    same_fabric_tier: float | None = None
    same_zone: float | None = None
    cross_zone: float | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _inf(cls, v: Any) -> Any:
        return _speed(v)

    @field_validator("*")
    @classmethod
    def _positive(cls, v: float | None) -> float | None:
        if v is not None and not v > 0:
            raise ValueError("must be a positive speed in GB/s, or .inf for free")
        return v

    def over(self, base: TierBandwidth) -> TierBandwidth:
        # model_construct: the extender's 1 MB/s - 100 TB/s range guards its gravity ratio, which the
        # planner does not compute; a plan's transfer is GB / speed, 0 at .inf.
        return TierBandwidth.model_construct(**{**base.model_dump(), **self.model_dump(exclude_none=True)})


@dataclass(frozen=True, slots=True)
class ClusterFile:
    items: list[dict[str, Any]]  # Node objects of a List; empty for the groups format
    bandwidth: Bandwidth | None = None
    groups: tuple[dict[str, Any], ...] = ()  # the groups format, validated

    @property
    def size(self) -> int:
        return sum(g.get("count", 1) for g in self.groups) if self.groups else len(self.items)

    @property
    def nodes(self) -> list[dict[str, Any]]:
        """Every node (a 20,000-node file is 20,000 objects: see ``sample``)."""
        return self.sample(None)

    def sample(self, per_group: int | None) -> list[dict[str, Any]]:
        """The nodes, at most ``per_group`` of each group: a group's nodes differ only by name (and
        their own NVLink domain), so a plan of n tasks never needs more than its first n
        (docs/planner.md, "Size")."""
        if not self.groups:
            return self.items
        cut = [{**g, "count": min(g.get("count", 1), per_group or g.get("count", 1))} for g in self.groups]
        return expand_cluster({"groups": cut})


def _unknown(where: str, keys: Any, known: tuple[str, ...] | list[str]) -> str | None:
    extra = [str(k) for k in keys if k not in known]
    if not extra:
        return None
    k = extra[0][:64]
    near = difflib.get_close_matches(k, list(known), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(known)})"
    return f"{where}: {k!r} is not a field{hint}"


def _problems(exc: ValidationError, fields: tuple[str, ...] | list[str]) -> str:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "?"
        if err["type"] == "extra_forbidden":
            near = difflib.get_close_matches(str(err["loc"][-1]), list(fields), n=1)
            out.append(f"{loc!r} is not a field" + (f" (did you mean {near[0]!r}?)" if near else ""))
        else:
            out.append(f"field {loc!r}: {err['msg']}")
    return "; ".join(out)


def load_cluster(path: str | Path | None = None, data: Any = None) -> ClusterFile:
    """The nodes of ``path`` (or its already read ``data``), or of the bundled demo cluster."""
    if data is None:
        data = read_cluster_file(path, ClusterFileError) if path else load_yaml(None, "cluster.yaml")
    where = str(path or "bundled cluster.yaml")
    if not isinstance(data, dict):
        raise ClusterFileError(f"{where}: expected a mapping with 'groups' or 'items'")
    if (bad := _unknown(where, data, TOP_KEYS)) is not None:
        raise ClusterFileError(bad)
    bandwidth = None
    if "bandwidth_gbps" in data:
        try:
            bandwidth = Bandwidth.model_validate(data["bandwidth_gbps"])
        except ValidationError as exc:
            raise ClusterFileError(f"{where}: bandwidth_gbps: "
                                   f"{_problems(exc, list(Bandwidth.model_fields))}") from None
    if "groups" in data:
        groups = data["groups"]
        if not isinstance(groups, list) or not groups:
            raise ClusterFileError(f"{where}: 'groups' must be a non-empty list")
        if len(groups) > MAX_NODES:
            raise ClusterFileError(f"{where}: {len(groups)} groups; at most {MAX_NODES} nodes in all")
        total = 0
        valid: list[dict[str, Any]] = []
        for i, g in enumerate(groups):
            label = f"groups[{i}]"
            if isinstance(g, dict) and isinstance(g.get("prefix"), str):
                label += f" ({g['prefix'][:64]})"
            if not isinstance(g, dict):
                raise ClusterFileError(f"{where}: {label}: expected a mapping of fields")
            try:
                group = Group.model_validate(g)
            except ValidationError as exc:
                why = _problems(exc, list(Group.model_fields))
                raise ClusterFileError(f"{where}: {label}: {why}") from None
            total += group.count
            valid.append(group.model_dump(exclude_none=True))
            # The sum is checked before a single node is built.
            if total > MAX_NODES:
                raise ClusterFileError(f"{where}: more than {MAX_NODES} nodes in all (at {label})")
        return ClusterFile([], bandwidth, tuple(valid))
    items = data.get("items")
    if isinstance(items, list) and all(
        isinstance(i, dict) and i.get("kind", "Node") == "Node" for i in items
    ):
        if len(items) > MAX_NODES:
            raise ClusterFileError(f"{where}: {len(items)} nodes; at most {MAX_NODES}")
        return ClusterFile(items, bandwidth)
    raise ClusterFileError(
        f"{where}: expected 'groups' (the demo format) or a List of Node objects ('items')")


def cluster_nodes(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The nodes of ``path``, or of the bundled demo cluster."""
    return load_cluster(path).nodes
