"""How long a replayed pod takes to read its inputs over the network path it got.

A replay that starts a consumer as fast whether its producer's output sits on the same node or in
another zone gives data gravity no price: any placement looks as good as the nearest one, and the
replay cannot show what co-locating a pod with its data is worth. This model charges the read:
``DataPath.read_seconds`` is meant to be added to the pod's run time on the node it got by the
replay's runtime callback (runtime.py models the compute part).

Distance comes from node labels only, innermost first: same node (``kubernetes.io/hostname``), same
NVLink domain (``nvidia.com/gpu.clique``), same leaf (``fabric.topograph.run/tier-0``), same spine
(``fabric.topograph.run/tier-1``), same zone (``topology.kubernetes.io/zone``; two nodes without the
zone label count as one zone), else cross zone. A label counts only when both nodes carry it with
the same non-empty value (the zone rule excepted).

Each tier has one consumer's single-stream bandwidth, from a public vendor or cloud-provider source
stated row by row in bench/data/data_path.yaml. Never the extender's own ``tier_bandwidth_gbps``
settings: a replay must not judge placements by the model whose quality it measures.

The charge: the consumer stages each producer share onto its own node over that share's path
(share / tier bandwidth), then reads it from local NVMe (share / same-node bandwidth); the steps are
not overlapped, and a share already on the consumer's node pays the local read only. A producer that
is a gang has several sites, each holding an equal share; the consumer reads the shares one after
another through its one link, so the times add up.

Pure: no Kubernetes client, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).resolve().parents[1] / "bench" / "data" / "data_path.yaml"

HOSTNAME_LABEL = "kubernetes.io/hostname"
NVLINK_LABEL = "nvidia.com/gpu.clique"
LEAF_LABEL = "fabric.topograph.run/tier-0"
SPINE_LABEL = "fabric.topograph.run/tier-1"
ZONE_LABEL = "topology.kubernetes.io/zone"

SAME_NODE = "same-node"
SAME_NVLINK = "same-nvlink-domain"
SAME_LEAF = "same-leaf"
SAME_SPINE = "same-spine"
SAME_ZONE = "same-zone"
CROSS_ZONE = "cross-zone"
# Innermost first; the data file must have exactly these.
TIERS: tuple[str, ...] = (SAME_NODE, SAME_NVLINK, SAME_LEAF, SAME_SPINE, SAME_ZONE, CROSS_ZONE)
# Label that must match (non-empty, equal on both nodes) for each tier short of zone.
_MATCH: tuple[tuple[str, str], ...] = (
    (SAME_NODE, HOSTNAME_LABEL),
    (SAME_NVLINK, NVLINK_LABEL),
    (SAME_LEAF, LEAF_LABEL),
    (SAME_SPINE, SPINE_LABEL),
)
_TEXT_FIELDS = ("source", "says", "how")

Labels = Mapping[str, str]


class DataPathError(ValueError):
    """The data-path table is unusable; the message names the row and field."""


@dataclass(frozen=True, slots=True)
class TierRow:
    """One tier of bench/data/data_path.yaml."""

    tier: str
    gb_per_s: float
    source: str
    says: str
    how: str
    derived: bool
    derived_reason: str = ""


@dataclass(frozen=True, slots=True)
class TierRead:
    """What one read moved through one tier: GB and the seconds they cost."""

    gb: float
    seconds: float


def _row(i: int, raw: Any) -> TierRow:
    if not isinstance(raw, Mapping):
        raise DataPathError(f"data path row {i} is not a mapping")
    tier = raw.get("tier")
    if tier not in TIERS:
        raise DataPathError(f"data path row {i}: unknown tier {tier!r} (expected one of {', '.join(TIERS)})")
    bw = raw.get("gb_per_s")
    if isinstance(bw, bool) or not isinstance(bw, int | float):
        raise DataPathError(f"data path tier {tier}: gb_per_s must be a number, got {bw!r}")
    if not math.isfinite(bw) or bw <= 0:
        raise DataPathError(f"data path tier {tier}: gb_per_s must be finite and above 0, got {bw!r}")
    text: dict[str, str] = {}
    for field in _TEXT_FIELDS:
        value = raw.get(field)
        if not isinstance(value, str) or not value.strip():
            raise DataPathError(f"data path tier {tier}: {field} is missing or empty")
        text[field] = value.strip()
    if not text["source"].startswith("https://"):
        raise DataPathError(f"data path tier {tier}: source must be an https:// URL, got {text['source']!r}")
    derived = raw.get("derived")
    if not isinstance(derived, bool):
        raise DataPathError(f"data path tier {tier}: derived must be true or false, got {derived!r}")
    reason = raw.get("derived_reason", "")
    if derived and (not isinstance(reason, str) or not reason.strip()):
        raise DataPathError(f"data path tier {tier}: derived is true but derived_reason is missing")
    return TierRow(tier=str(tier), gb_per_s=float(bw), source=text["source"], says=text["says"],
                   how=text["how"], derived=derived, derived_reason=str(reason or "").strip())


def tier(consumer: Labels, producer: Labels) -> str:
    """The innermost tier two nodes share, from their labels."""
    for name, key in _MATCH:
        value = consumer.get(key, "")
        if value and producer.get(key, "") == value:
            return name
    # Two nodes without zone labels are taken to be in one (unlabelled) zone.
    if consumer.get(ZONE_LABEL, "") == producer.get(ZONE_LABEL, ""):
        return SAME_ZONE
    return CROSS_ZONE


class DataPath:
    """Single-stream read bandwidth per tier, and the time a consumer takes to read its inputs."""

    def __init__(self, rows: Sequence[Any]) -> None:
        if isinstance(rows, str | bytes) or not isinstance(rows, Sequence):
            raise DataPathError("data path tiers must be a list of rows")
        by_tier: dict[str, TierRow] = {}
        for i, raw in enumerate(rows):
            row = _row(i, raw)
            if row.tier in by_tier:
                raise DataPathError(f"data path tier {row.tier} appears twice")
            by_tier[row.tier] = row
        missing = [t for t in TIERS if t not in by_tier]
        if missing:
            raise DataPathError(f"data path is missing tier(s): {', '.join(missing)}")
        self.rows: dict[str, TierRow] = {t: by_tier[t] for t in TIERS}
        self.gb_per_s: dict[str, float] = {t: r.gb_per_s for t, r in self.rows.items()}

    @classmethod
    def load(cls, path: Path = DATA) -> DataPath:
        doc = yaml.safe_load(path.read_text())
        if not isinstance(doc, Mapping) or "tiers" not in doc:
            raise DataPathError(f"{path}: no 'tiers' list")
        return cls(doc["tiers"])

    def tier(self, consumer: Labels, producer: Labels) -> str:
        """The innermost tier the consumer's node shares with the producer's node."""
        return tier(consumer, producer)

    def seconds_per_gb(self, name: str) -> float:
        """Seconds to stage (unless local) and read one GB at tier ``name``."""
        local = 1.0 / self.gb_per_s[SAME_NODE]
        return local if name == SAME_NODE else local + 1.0 / self.gb_per_s[name]

    def by_tier(self, gb: float, consumer: Labels, sites: Sequence[Labels]) -> dict[str, TierRead]:
        """GB and seconds per tier for reading ``gb`` held in equal shares at ``sites`` (producer nodes'
        labels; a plain pod is one site, a gang one site per member). Tiers not crossed are absent."""
        if isinstance(gb, bool) or not math.isfinite(gb) or gb < 0:
            raise ValueError(f"input data must be a finite number of GB, at least 0, got {gb!r}")
        if gb == 0:
            return {}
        if not sites:
            raise ValueError(f"{gb:g} GB to read but no producer site holds it")
        share = gb / len(sites)
        totals: dict[str, list[float]] = {}
        for site in sites:
            name = tier(consumer, site)
            acc = totals.setdefault(name, [0.0, 0.0])
            acc[0] += share
            acc[1] += share * self.seconds_per_gb(name)
        return {t: TierRead(gb=totals[t][0], seconds=totals[t][1]) for t in TIERS if t in totals}

    def read_seconds(self, gb: float, consumer: Labels, sites: Sequence[Labels]) -> float:
        """Seconds the consumer spends reading ``gb`` of input from the producer ``sites``."""
        return sum(r.seconds for r in self.by_tier(gb, consumer, sites).values())
