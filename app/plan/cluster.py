"""Node objects from a cluster file: the demo's compact ``groups`` format (app/demo/cluster.yaml), or
Node objects as ``kubectl get nodes -o yaml`` prints them (a List with ``items``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.sim.fleet import expand_cluster, load_yaml


def cluster_nodes(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The nodes of ``path``, or of the bundled demo cluster."""
    data = load_yaml(path, "cluster.yaml")
    if "groups" in data:
        return expand_cluster(data)
    items = data.get("items")
    if isinstance(items, list) and all(
        isinstance(i, dict) and i.get("kind", "Node") == "Node" for i in items
    ):
        return items
    raise ValueError(f"{path}: expected 'groups' (the demo format) or a List of Node objects ('items')")
