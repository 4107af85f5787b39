"""The NVLink clique of each node as the driver's compute-domain side reports it (ComputeDomainClique
``daemons[]``, or ComputeDomain ``status.nodes[]`` when the driver does not use clique objects), for
nodes whose slices carry no clique id (docs/dra.md, "IMEX cliques"). Pure."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from app.dra.devices import MAX_DEVICES, MAX_NAME, as_dict


def _domain_key(kind: str, obj: dict[str, Any]) -> str:
    meta = as_dict(obj.get("metadata"))
    return f"{kind}/{meta.get('namespace') or ''}/{meta.get('name') or ''}"


@dataclass(slots=True)
class ComputeDomains:
    """The clique ids the compute-domain objects report, per object and node."""

    # kind/namespace/name of a ComputeDomainClique or ComputeDomain -> node -> clique id.
    cliques: dict[str, dict[str, str]] = field(default_factory=dict)

    def put(self, kind: str, obj: dict[str, Any]) -> set[str]:
        """A ComputeDomainClique or ComputeDomain: the clique id of each node in it. Returns the
        nodes whose clique id may have changed."""
        key = _domain_key(kind, obj)
        cliques = kind == "computedomaincliques"
        raw = obj.get("daemons") if cliques else as_dict(obj.get("status")).get("nodes")
        nodes: dict[str, str] = {}
        for d in (raw if isinstance(raw, list) else [])[:MAX_DEVICES]:
            node = as_dict(d).get("nodeName" if cliques else "name")
            clique = as_dict(d).get("cliqueID")
            if isinstance(node, str) and node and isinstance(clique, str) and clique:
                nodes[node] = clique[:MAX_NAME]
        old = self.cliques.pop(key, {})
        if nodes:
            self.cliques[key] = nodes
        return {n for n in set(old) | set(nodes) if old.get(n) != nodes.get(n)}

    def drop(self, kind: str, obj: dict[str, Any]) -> set[str]:
        return set(self.cliques.pop(_domain_key(kind, obj), {}))

    def clear(self, kind: str) -> set[str]:
        gone = [k for k in self.cliques if k.startswith(kind + "/")]
        return set().union(*(set(self.cliques.pop(k)) for k in gone))

    def node_clique(self, node: str) -> str | None:
        seen = Counter(c[node] for c in self.cliques.values() if node in c)
        return seen.most_common(1)[0][0] if seen else None
