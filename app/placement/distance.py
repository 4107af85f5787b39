"""How far apart two nodes are, and what moving a GB across that distance costs (docs/data-gravity.md).

Cost model (why a ladder of hops rather than one bandwidth per tier): a consumer always pays for
reading the producer's local copy (``same_node``); every tier it must cross adds a store-and-forward
hop at that tier's bandwidth — the NVLink domain, then each fabric tier inward to outward (leaf, spine,
block...), then the zone network, then the inter-zone link. Summing hops makes the cost strictly grow
with distance whatever bandwidths the operator configures (the default NVLink figure is faster than the
local-disk one, so a per-tier figure alone would rank "same NVLink domain" above "same node").
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType

from app.config.policy import ZONE_LABEL, TierBandwidth
from app.snapshot.nodes import NodeFacts


class Distance(IntEnum):
    """How far a candidate node is from a producer's data, nearest first."""

    NODE = 0
    NVLINK = 1
    FABRIC = 2
    ZONE = 3
    CROSS_ZONE = 4

    @property
    def label(self) -> str:
        """Metric label and explain value (bounded vocabulary)."""
        return _LABELS[self]


_LABELS = {
    Distance.NODE: "node",
    Distance.NVLINK: "nvlink",
    Distance.FABRIC: "fabric",
    Distance.ZONE: "zone",
    Distance.CROSS_ZONE: "cross-zone",
}
MISSING = "missing"  # the distance label of an edge whose producer could not be found

# llm-placement.io/colocation levels (the parser maps "required" to "node").
LEVELS: Mapping[str, Distance] = MappingProxyType({
    "node": Distance.NODE,
    "nvlink": Distance.NVLINK,
    "leaf": Distance.FABRIC,
    "fabric": Distance.FABRIC,
    "zone": Distance.ZONE,
})
# Levels that accept only the inner-most fabric tiers: "leaf" is the same NVLink domain or the same
# tier-0 domain (leaf switch), where a prefill/decode pair's KV-cache transfers stay one hop.
MAX_RUNG = {"leaf": 0}
LEVEL_WORDS = {"node": "node", "nvlink": "NVLink domain", "leaf": "NVLink domain or leaf switch",
                "fabric": "fabric tier", "zone": "zone"}


def within_level(level: str, distance: Distance, rung: int) -> bool:
    """Does a pair at ``distance`` (and, for FABRIC, inner-most shared ``rung``) satisfy ``level``?"""
    if distance > LEVELS[level]:
        return False
    cap = MAX_RUNG.get(level)
    return cap is None or distance is not Distance.FABRIC or rung <= cap


class HopLadder:
    """Seconds per GB between two nodes, from the configured tier bandwidths."""

    def __init__(self, fabric_tiers: tuple[tuple[str, ...], ...], tier_bandwidth: TierBandwidth) -> None:
        # Fabric tiers that are really the zone label are "same zone", not "same fabric tier".
        tiers = fabric_tiers
        self.fabric_index = [i for i, keys in enumerate(tiers) if ZONE_LABEL not in keys]
        bw = tier_bandwidth
        hops = [1 / bw.same_node, 1 / bw.same_nvlink_domain]
        hops += [1 / bw.same_fabric_tier] * len(self.fabric_index)
        hops += [1 / bw.same_zone, 1 / bw.cross_zone]
        ladder = [sum(hops[: i + 1]) for i in range(len(hops))]
        nf = len(self.fabric_index)
        self.node_s = ladder[0]
        self.nvlink_s = ladder[1]
        self._fabric_s = ladder[2 : 2 + nf]  # by rung: the inner-most shared fabric tier
        self._zone_s = ladder[2 + nf]
        self._cross_s = ladder[3 + nf]

    def distance(self, a: NodeFacts, b: NodeFacts) -> tuple[Distance, int]:
        """Distance between two nodes, and for FABRIC the rung of the inner-most shared tier."""
        if a.name == b.name:
            return Distance.NODE, -1
        if a.nvlink_domain == b.nvlink_domain:
            return Distance.NVLINK, -1
        return self._far(a.fabric, a.zone, b.fabric, b.zone)

    def _far(
        self, fa: tuple[str, ...], za: str, fb: tuple[str, ...], zb: str
    ) -> tuple[Distance, int]:
        """Distance between nodes known to be in different NVLink domains: fabric ids and zone only."""
        for rung, i in enumerate(self.fabric_index):
            x = fa[i] if i < len(fa) else ""
            if x and fb[i:i + 1] == (x,):
                return Distance.FABRIC, rung
        # Two nodes without zone labels are taken to share the (single, unlabelled) site.
        if za == zb:
            return Distance.ZONE, -1
        return Distance.CROSS_ZONE, -1

    def far_s(self, fa: tuple[str, ...], za: str, fb: tuple[str, ...], zb: str) -> float:
        """Seconds per GB of ``_far`` without building the enum (the prioritize hot path)."""
        for rung, i in enumerate(self.fabric_index):
            x = fa[i] if i < len(fa) else ""
            if x and fb[i:i + 1] == (x,):
                return self._fabric_s[rung]
        return self._zone_s if za == zb else self._cross_s

    def seconds_per_gb(self, distance: Distance, rung: int = 0) -> float:
        if distance is Distance.NODE:
            return self.node_s
        if distance is Distance.NVLINK:
            return self.nvlink_s
        if distance is Distance.FABRIC:
            return self._fabric_s[max(0, min(rung, len(self._fabric_s) - 1))]
        if distance is Distance.ZONE:
            return self._zone_s
        return self._cross_s
