"""Node objects from a cluster file: the demo's compact ``groups`` format (app/demo/cluster.yaml), or
Node objects as ``kubectl get nodes -o yaml`` prints them (a List with ``items``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.core.datafile import load_user_yaml, problems
from app.objects import expand_cluster, load_yaml

MAX_FILE_BYTES = 64 * 1024 * 1024  # kubectl get nodes -o yaml of a 5,000-node cluster fits
MAX_NODES = 20_000


class ClusterFileError(ValueError):
    """The cluster file is unusable; the message names the group or item and the field."""


class Group(BaseModel):
    """One group of identical nodes in the demo format (app/demo/cluster.yaml)."""

    model_config = ConfigDict(extra="allow")

    prefix: str = Field(min_length=1, max_length=200, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    count: int = Field(1, ge=1, le=MAX_NODES)
    gpus: int = Field(0, ge=0, le=64)


def cluster_nodes(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The nodes of ``path``, or of the bundled demo cluster."""
    data = load_user_yaml(path, ClusterFileError, MAX_FILE_BYTES) if path else load_yaml(None, "cluster.yaml")
    where = str(path or "bundled cluster.yaml")
    if not isinstance(data, dict):
        raise ClusterFileError(f"{where}: expected a mapping with 'groups' or 'items'")
    if "groups" in data:
        groups = data["groups"]
        if not isinstance(groups, list) or not groups:
            raise ClusterFileError(f"{where}: 'groups' must be a non-empty list")
        total = 0
        for i, g in enumerate(groups):
            if not isinstance(g, dict):
                raise ClusterFileError(f"{where}: group #{i + 1}: expected a mapping of fields")
            try:
                total += Group.model_validate(g).count
            except ValidationError as exc:
                raise ClusterFileError(f"{where}: group #{i + 1}: {problems(exc)}") from None
        if total > MAX_NODES:
            raise ClusterFileError(f"{where}: {total} nodes in all; at most {MAX_NODES}")
        return expand_cluster(data)
    items = data.get("items")
    if isinstance(items, list) and all(
        isinstance(i, dict) and i.get("kind", "Node") == "Node" for i in items
    ):
        if len(items) > MAX_NODES:
            raise ClusterFileError(f"{where}: {len(items)} nodes; at most {MAX_NODES}")
        return items
    raise ClusterFileError(
        f"{where}: expected 'groups' (the demo format) or a List of Node objects ('items')")
