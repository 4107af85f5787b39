"""Which score plugins a kube-scheduler profile runs, read from a KubeSchedulerConfiguration.

The simulator (``app.sim.scheduler``) adds exactly what kube-scheduler v1.36 adds for a node:
``sum(plugin score x plugin weight)`` over the profile's enabled score plugins, plus each interested
extender's ``score x weight x 10`` (MaxNodeScore / MaxExtenderPriority). This module turns a
configuration file into those weights.

Modelled (they vary between nodes for the pods the simulator generates): **NodeResourcesFit**
(LeastAllocated or MostAllocated, any cpu/memory/GPU resources and weights from its
``scoringStrategy``) and **NodeResourcesBalancedAllocation**. Assumed constant, because those pods have
no tolerations, affinities, spread constraints or volumes and the simulated nodes carry no
PreferNoSchedule taints and no images: the plugins in ``CONSTANT_PLUGINS``. A constant added to every
node cannot change which node wins, so leaving them out is exact for such pods; for a pod that does
carry any of those fields the simulator counts it as not modelled (``SimScheduler.unmodelled``).
Anything else (``RequestedToCapacityRatio``, out-of-tree plugins) is refused, not guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

# The default profile's score plugins and weights (pkg/scheduler/apis/config/v1/default_plugins.go).
DEFAULT_SCORE_WEIGHTS: dict[str, int] = {
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "NodeResourcesFit": 1,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesBalancedAllocation": 1,
    "ImageLocality": 1,
    "VolumeBinding": 1,
    "DynamicResources": 2,
}
FIT, BALANCED = "NodeResourcesFit", "NodeResourcesBalancedAllocation"
MODELLED_PLUGINS = (FIT, BALANCED)
# Why each remaining default score plugin gives every node the same score for the simulated pods.
CONSTANT_PLUGINS: dict[str, str] = {
    "TaintToleration": "no PreferNoSchedule taints on the nodes: every node scores 100",
    "NodeAffinity": "no preferred node affinity on the pods: PreScore skips",
    "PodTopologySpread": "no spread constraints, and bare pods match no default constraint: skips",
    "InterPodAffinity": "no pod (anti-)affinity on the pods or on bound pods: skips",
    "ImageLocality": "the nodes report no images: 0 everywhere",
    "VolumeBinding": "no PersistentVolumeClaims: skips",
    "DynamicResources": "no ResourceClaims with firstAvailable subrequests: skips",
}
STRATEGIES = ("LeastAllocated", "MostAllocated")
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
EXTENDER_SCALE = MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY  # kube-scheduler multiplies extender scores by 10

# The chart's configuration, the one users install; found relative to the source tree.
CHART_SCHEDULER_CONFIG = (
    Path(__file__).resolve().parents[2] / "helm" / "llm-placement" / "files" / "scheduler-config.yaml"
)
# The same profile for an installed package without the chart next to it (the wheel ships app/ only).
# tests/unit/sim/test_sim_scheduler.py keeps it equal to what the chart file parses to.
SHIPPED_FALLBACK: dict[str, Any] = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "percentageOfNodesToScore": 100,
    "profiles": [{
        "schedulerName": "llm-placement",
        "plugins": {"score": {"disabled": [{"name": FIT}, {"name": BALANCED}, {"name": "ImageLocality"}]}},
    }],
    "extenders": [{"urlPrefix": "http://127.0.0.1:8888/scheduler", "filterVerb": "filter",
                   "prioritizeVerb": "prioritize", "bindVerb": "bind", "weight": 130}],
}


class ProfileError(ValueError):
    """The configuration asks for something the simulator does not model."""


@dataclass(frozen=True, slots=True)
class ResourceWeight:
    name: str
    weight: int = 1


CPU_MEMORY: tuple[ResourceWeight, ...] = (ResourceWeight("cpu"), ResourceWeight("memory"))


@dataclass(frozen=True, slots=True)
class SchedulerProfile:
    """One profile's score plugins and the extender as kube-scheduler would combine them."""

    name: str
    score_weights: Mapping[str, int]  # every enabled score plugin -> weight
    fit_strategy: str = "LeastAllocated"
    fit_resources: tuple[ResourceWeight, ...] = CPU_MEMORY
    balanced_resources: tuple[ResourceWeight, ...] = CPU_MEMORY
    extender_weight: int | None = None  # None: no extender prioritizes (or none at all)
    extender_filters: bool = False
    managed_resources: tuple[str, ...] = ()  # extender's managedResources: it sees only such pods
    percentage_of_nodes_to_score: int | None = None
    source: str = ""
    label: str = ""

    @property
    def fit_weight(self) -> int:
        return self.score_weights.get(FIT, 0)

    @property
    def balanced_weight(self) -> int:
        return self.score_weights.get(BALANCED, 0)

    @property
    def has_extender(self) -> bool:
        return self.extender_weight is not None or self.extender_filters

    @property
    def constant_plugins(self) -> tuple[str, ...]:
        return tuple(p for p in self.score_weights if p in CONSTANT_PLUGINS)

    def without_extender(self, label: str = "") -> SchedulerProfile:
        return replace(self, extender_weight=None, extender_filters=False, managed_resources=(),
                       label=label or self.label)

    def with_extender(self, weight: int, label: str = "") -> SchedulerProfile:
        return replace(self, extender_weight=weight, extender_filters=True, label=label or self.label)

    def describe(self) -> str:
        """One line for report headers: what decides, what is assumed constant."""
        parts = []
        if self.fit_weight:
            res = "+".join(r.name if r.weight == 1 else f"{r.name}x{r.weight}" for r in self.fit_resources)
            parts.append(f"{FIT} {self.fit_strategy}({res}) x{self.fit_weight}")
        if self.balanced_weight:
            parts.append(f"{BALANCED} x{self.balanced_weight}")
        if self.extender_weight is not None:
            parts.append(f"extender band x{self.extender_weight} x{EXTENDER_SCALE}")
        elif self.extender_filters:
            parts.append("extender filter only")
        text = " + ".join(parts) or "no varying score plugin"
        if self.constant_plugins:
            text += f"; constant here: {', '.join(self.constant_plugins)}"
        pct = self.percentage_of_nodes_to_score
        text += f"; percentageOfNodesToScore {pct if pct else 'adaptive'}"
        return f"{self.label or self.name}: {text}"


# --- reading a KubeSchedulerConfiguration -------------------------------------------------------
def _names(entries: Any) -> list[dict[str, Any]]:
    return [e for e in (entries or []) if isinstance(e, dict) and e.get("name")]


def _score_weights(plugins: Mapping[str, Any]) -> dict[str, int]:
    """The score extension point after merging the profile's plugin sets into the defaults."""
    weights = dict(DEFAULT_SCORE_WEIGHTS)
    for point in ("multiPoint", "score"):
        section = plugins.get(point) or {}
        disabled = {e["name"] for e in _names(section.get("disabled"))}
        if "*" in disabled:
            weights = {}
        for name in disabled - {"*"}:
            weights.pop(name, None)
        for e in _names(section.get("enabled")):
            # Weight 0 or unset means 1 for score plugins (frameworkImpl), else the default weight.
            w = int(e.get("weight") or 0)
            weights[e["name"]] = w or (weights.get(e["name"]) or DEFAULT_SCORE_WEIGHTS.get(e["name"], 1))
    return weights


def _resources(raw: Any, default: tuple[ResourceWeight, ...]) -> tuple[ResourceWeight, ...]:
    if not raw:
        return default
    return tuple(ResourceWeight(str(r["name"]), int(r.get("weight") or 1)) for r in raw)


def profile_from_config(
    doc: Mapping[str, Any], scheduler_name: str | None = None, *, source: str = "", label: str = ""
) -> SchedulerProfile:
    """The named profile (default: ``llm-placement`` if present, else the first) of a configuration."""
    if doc.get("kind") not in (None, "KubeSchedulerConfiguration"):
        raise ProfileError(f"{source or 'config'}: not a KubeSchedulerConfiguration")
    profiles = [p for p in doc.get("profiles") or [] if isinstance(p, dict)]
    if not profiles:
        profiles = [{"schedulerName": "default-scheduler"}]
    names = [p.get("schedulerName") or "default-scheduler" for p in profiles]
    want = scheduler_name or ("llm-placement" if "llm-placement" in names else names[0])
    if want not in names:
        raise ProfileError(f"{source or 'config'}: no profile {want!r} (found {names})")
    prof = profiles[names.index(want)]
    weights = _score_weights(prof.get("plugins") or {})
    unknown = tuple(p for p in weights if p not in MODELLED_PLUGINS and p not in CONSTANT_PLUGINS)
    if unknown:
        raise ProfileError(f"score plugins not modelled by the simulator: {', '.join(unknown)}")

    fit_strategy, fit_resources, balanced_resources = "LeastAllocated", CPU_MEMORY, CPU_MEMORY
    for pc in _names(prof.get("pluginConfig")):
        args = pc.get("args") or {}
        if pc["name"] == FIT:
            strategy = args.get("scoringStrategy") or {}
            fit_strategy = str(strategy.get("type") or "LeastAllocated")
            if fit_strategy not in STRATEGIES:
                raise ProfileError(f"{FIT} scoringStrategy {fit_strategy!r} not modelled ({STRATEGIES})")
            fit_resources = _resources(strategy.get("resources"), CPU_MEMORY)
        elif pc["name"] == BALANCED:
            balanced_resources = _resources(args.get("resources"), CPU_MEMORY)

    extenders = [e for e in doc.get("extenders") or [] if isinstance(e, dict)]
    if len(extenders) > 1:
        raise ProfileError("the simulator models at most one extender")
    ext = extenders[0] if extenders else None
    ext_weight = None
    if ext is not None and ext.get("prioritizeVerb"):
        ext_weight = int(ext.get("weight") or 1)  # v1 defaulting: weight 0 becomes 1
    managed = tuple(str(m["name"]) for m in _names(ext.get("managedResources"))) if ext else ()
    pct = prof.get("percentageOfNodesToScore", doc.get("percentageOfNodesToScore"))
    return SchedulerProfile(
        name=want, score_weights=weights, fit_strategy=fit_strategy, fit_resources=fit_resources,
        balanced_resources=balanced_resources, extender_weight=ext_weight,
        extender_filters=bool(ext and ext.get("filterVerb")), managed_resources=managed,
        percentage_of_nodes_to_score=int(pct) if pct is not None else None,
        source=source, label=label or want,
    )


def load_profile(
    path: str | Path | None = None, scheduler_name: str | None = None, *, label: str = ""
) -> SchedulerProfile:
    """A profile from a configuration file (default: the chart's shipped scheduler-config.yaml)."""
    file = Path(path) if path is not None else CHART_SCHEDULER_CONFIG
    if path is None and not file.is_file():
        return profile_from_config(SHIPPED_FALLBACK, scheduler_name, source="built-in copy of the chart's",
                                   label=label or "shipped")
    doc = yaml.safe_load(file.read_text())
    if not isinstance(doc, dict):
        raise ProfileError(f"{file}: expected a mapping")
    return profile_from_config(doc, scheduler_name, source=str(file), label=label)


def shipped_profile() -> SchedulerProfile:
    """What the chart installs: the ``llm-placement`` profile with the extender."""
    return load_profile(label="shipped (chart)")


def _extender(weight: int) -> dict[str, Any]:
    return {"filterVerb": "filter", "prioritizeVerb": "prioritize", "weight": weight}


def default_profile(extender_weight: int | None = None) -> SchedulerProfile:
    """kube-scheduler's default profile; with an extender of the given weight if one is given."""
    doc: dict[str, Any] = {"kind": "KubeSchedulerConfiguration"}
    if extender_weight is not None:
        doc["extenders"] = [_extender(extender_weight)]
    label = "default profile" + (f" + extender x{extender_weight}" if extender_weight is not None else "")
    return profile_from_config(doc, source="built-in", label=label)


def most_allocated_profile(
    extender_weight: int | None = None, gpu_resource: str = "nvidia.com/gpu"
) -> SchedulerProfile:
    """The bin-packing an operator configures without us: NodeResourcesFit MostAllocated on GPUs."""
    doc: dict[str, Any] = {
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{
            "schedulerName": "default-scheduler",
            "pluginConfig": [{"name": FIT, "args": {"scoringStrategy": {
                "type": "MostAllocated", "resources": [{"name": gpu_resource, "weight": 1}]}}}],
        }],
    }
    if extender_weight is not None:
        doc["extenders"] = [_extender(extender_weight)]
    label = "MostAllocated(gpu)" + (f" + extender x{extender_weight}" if extender_weight is not None else "")
    return profile_from_config(doc, source="built-in", label=label)
