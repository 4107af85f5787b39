"""Typed, immutable policies: what each part of the pure core reads from the configuration.

The settings file (``app.config.settings.Settings``) also holds listen addresses, kubeconfig and limits that
no placement rule reads. Each component here gets only its own knobs, built once at start by
``Settings.policies()``, the way scheduler-plugins hands the coscheduling plugin its
``CoschedulingArgs``: a component cannot read what it was not given, and nothing changes under it.
Tests that need another value build another policy (``dataclasses.replace``), never mutate one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.placement.ranking import ScoreMapping
from app.serving.model import ServingCalibration
from app.serving.profiles import ProfileSource

ZONE_LABEL = "topology.kubernetes.io/zone"


# A weight is a share of one stage's weighted mean, so only ratios matter. Bounds keep the mean finite
# and meaningful: above MAX_WEIGHT the sum of nine terms can overflow to inf (inf/inf: every total
# NaN), and a positive weight under MIN_WEIGHT is lost in float rounding (docs/scoring.md).
MIN_WEIGHT = 0.001
MAX_WEIGHT = 1000.0


class StageWeights(BaseModel):
    """Weights of the prioritize terms for one stage. Terms absent from a stage weigh 0."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True)

    memory_fit: float = Field(1.0, ge=0, le=MAX_WEIGHT)
    """How fully the pod's memory need fills the node's usable GPU (or host) memory: tight fits first,
    so large GPUs stay free for large models."""
    bandwidth: float = Field(0.0, ge=0, le=MAX_WEIGHT)
    """Speed: meeting the latency target (interactive serving), else ms/token or GPU memory bandwidth
    relative to the best candidate."""
    cost: float = Field(1.0, ge=0, le=MAX_WEIGHT)
    """Price of the pod on the node (per hour, or per token for batch serving)."""
    separation: float = Field(1.0, ge=0, le=MAX_WEIGHT)
    """Keeping stages that disturb each other (training, interactive serving) apart."""
    packing: float = Field(1.0, ge=0, le=MAX_WEIGHT)
    """Filling partly used nodes so that whole nodes stay free."""
    preference: float = Field(1.0, ge=0, le=MAX_WEIGHT)
    """The pod's own gpu-preference annotation."""
    node_class: float = Field(1.0, ge=0, le=MAX_WEIGHT)
    """The right class of node for the stage (CPU stages on CPU nodes)."""
    gravity: float = Field(1.0, ge=0, le=MAX_WEIGHT)
    """Closeness to the data the pod's producers wrote (docs/data-gravity.md)."""
    precision: float = Field(0.5, ge=0, le=MAX_WEIGHT)
    """Running at the first precision the pod allows rather than a later (lower) one."""

    @field_validator("*")
    @classmethod
    def _zero_or_meaningful(cls, v: float) -> float:
        if 0 < v < MIN_WEIGHT:
            raise ValueError(f"a weight is 0 (term off) or at least {MIN_WEIGHT:g}, not {v:g}")
        return v

    @model_validator(mode="after")
    def _some_term_counts(self) -> StageWeights:
        # Every term at 0: every node totals 0, so the stage's pods land wherever in-tree scores say
        # and explain shows a ranking that does not exist.
        if not any(getattr(self, t) > 0 for t in type(self).model_fields):
            raise ValueError("every term is 0: nodes could not be ranked; give at least one term a weight")
        return self


class NodeLabelKeys(BaseModel):
    """Where node facts come from; first hit wins (docs/node-facts.md). Every key is configurable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True)

    gpu_product: tuple[str, ...] = (
        "nvidia.com/gpu.product",
        "cloud.google.com/gke-accelerator",
        "node.koordinator.sh/gpu-model",
    )
    """Labels naming the GPU product."""
    gpu_memory_mib: tuple[str, ...] = ("nvidia.com/gpu.memory",)
    """Labels giving the GPU's memory in MiB."""
    gpu_compute_major: tuple[str, ...] = ("nvidia.com/gpu.compute.major",)
    """GPU Feature Discovery's compute capability (major): bounds the throughput of a product the
    catalog lacks."""
    gpu_compute_minor: tuple[str, ...] = ("nvidia.com/gpu.compute.minor",)
    """Compute capability (minor)."""
    # At least one: a node's GPUs could not be counted at all without it.
    gpu_resource: tuple[str, ...] = Field(("nvidia.com/gpu", "amd.com/gpu"), min_length=1)
    """Extended resources that count as GPUs (at least one)."""
    nvlink_domain: tuple[str, ...] = (
        "nvidia.com/gpu.clique",
        "accelerator.topograph.run/domain",
        "cloud.google.com/gce-topology-subblock",
    )
    """Labels naming the node's NVLink domain."""
    # Inner to outer. Each entry is one tier; the first label present at that tier names the domain.
    fabric_tiers: tuple[tuple[str, ...], ...] = (
        ("fabric.topograph.run/tier-0", "cloud.google.com/gce-topology-host",
         "topology.k8s.aws/network-node-layer-3", "ib.coreweave.cloud/leafgroup"),
        ("fabric.topograph.run/tier-1", "cloud.google.com/gce-topology-subblock",
         "topology.k8s.aws/network-node-layer-2", "ib.coreweave.cloud/superpod"),
        ("fabric.topograph.run/tier-2", "cloud.google.com/gce-topology-block",
         "topology.k8s.aws/network-node-layer-1"),
        (ZONE_LABEL,),
    )
    """Fabric tiers, inner to outer; each entry is one tier, and the first of its labels present on a
    node names the node's domain at that tier."""
    rdma: tuple[str, ...] = (
        "feature.node.kubernetes.io/pci-15b3.present",
        "feature.node.kubernetes.io/rdma.capable",
    )
    """Labels saying the node has RDMA."""
    rdma_resources: tuple[str, ...] = ("rdma/ib", "rdma/hca", "nvidia.com/hostdev")
    """Extended resources that give a pod RDMA."""


MIN_GBPS = 0.001
MAX_GBPS = 100_000.0


class TierBandwidth(BaseModel):
    """GB/s assumed between a producer and a consumer at each distance (data gravity)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True)

    # 1 MB/s to 100 TB/s: outside that a transfer time is 0 or overflows the gravity ratio.
    same_node: float = Field(20.0, ge=MIN_GBPS, le=MAX_GBPS)
    """Producer and consumer on the same node (local disk)."""
    same_nvlink_domain: float = Field(50.0, ge=MIN_GBPS, le=MAX_GBPS)
    """In the same NVLink domain."""
    same_fabric_tier: float = Field(25.0, ge=MIN_GBPS, le=MAX_GBPS)
    """Under the same fabric tier (the innermost tier both share)."""
    same_zone: float = Field(5.0, ge=MIN_GBPS, le=MAX_GBPS)
    """In the same zone."""
    cross_zone: float = Field(1.0, ge=MIN_GBPS, le=MAX_GBPS)
    """Across zones."""


@dataclass(frozen=True, slots=True)
class FeasibilityPolicy:
    """The hard rules' knobs (app.placement.feasibility, docs/stage-policy.md). Policies carry no defaults
    of their own: ``Settings.policies()`` fills every field, so each default is stated once, in
    app/config/settings.py."""

    cpu_stages_may_use_gpu_nodes: bool
    memory_headroom: float  # fraction of GPU memory kept free
    alignment_extra_headroom: float
    default_context_tokens: int
    default_concurrency: int
    # Interactive serving without max-ms-per-token: the target it is held to, and whether a node
    # missing it is filtered out when another candidate meets it (docs/stage-policy.md).
    default_interactive_ms_per_token: float
    default_target_filter: bool
    # The serving model's fitted parameters (docs/stage-policy.md, "The serving model").
    serving: ServingCalibration
    # The quantile of the estimate's error distribution a target is checked at (docs/stage-policy.md,
    # "Target decision").
    serving_confidence: float
    # Measured ms/token, TTFT and max concurrency that replace the estimates where a pod matches
    # (settings profiles_file, docs/stage-policy.md "Measured profiles"), and those learnt from live
    # serving metrics when live_profiles is set ("Learnt profiles").
    profiles: ProfileSource | None


@dataclass(frozen=True, slots=True)
class ScoringPolicy:
    """The soft preferences' knobs (app.placement.scoring, docs/scoring.md)."""

    weights: Mapping[str, StageWeights]  # by stage name
    memory_headroom: float
    default_interactive_ms_per_token: float
    score_mapping: ScoreMapping
    # Rank a whole GPU node below a partly used node of the same shape that fits (docs/scoring.md).
    whole_node_guard: bool
    # Across shapes the guard also prefers a partly used node of at least as good hardware when its
    # price premium is below this share of the price of the GPUs opening a whole node would strand.
    stranded_idle_share: float


@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    """What the placer reads: both rule sets and which extended resources count as GPUs."""

    feasibility: FeasibilityPolicy
    scoring: ScoringPolicy
    gpu_resources: tuple[str, ...]
    # Filter answers only our best node(s) (app/placement/narrowing.py); False: every feasible node.
    filter_to_best: bool


@dataclass(frozen=True, slots=True)
class NodeFactsPolicy:
    """How a Node object becomes NodeFacts (app.snapshot.nodes, docs/node-facts.md)."""

    labels: NodeLabelKeys
    default_cpu_hourly_cost: float
    unknown_gpu_hourly_cost: float


@dataclass(frozen=True, slots=True)
class GravityPolicy:
    """Data gravity's knobs (app.placement.gravity, docs/data-gravity.md)."""

    fabric_tiers: tuple[tuple[str, ...], ...]
    tier_bandwidth: TierBandwidth
    producer_memory_seconds: float
    negligible_seconds: float  # added to both sides of the term's ratio (docs/data-gravity.md)


@dataclass(frozen=True, slots=True)
class GangPolicy:
    """Gang planning and binding (app.gang, docs/gangs.md)."""

    feasibility: FeasibilityPolicy  # member eligibility per node is the placer's hard rules
    tier_names: tuple[str, ...]  # "NVLink domain", then one name per fabric tier, inner to outer
    reservation_ttl_seconds: float
    bind_timeout_seconds: float
    solver_time_limit_seconds: float
    # The first gang of the gang queue waiting this long holds whole nodes as they free
    # (app.gang.hold): the starvation bound.
    hold_after_seconds: float
    # Only this scheduler's gangs take part in the gang queue (empty: every gang).
    scheduler_name: str
    # A gang missing members this long after its first member's creation is reported.
    incomplete_warn_seconds: float
    # kube-scheduler's percentageOfNodesToScore (0: its adaptive default): tells an offer that is a
    # sample from one that is every node its filters passed (app.placement.offer).
    percentage_of_nodes_to_score: int


@dataclass(frozen=True, slots=True)
class LearnPolicy:
    """When a serving profile learnt from the engines' metrics applies, and for how long
    (app.serving.live_profiles, docs/stage-policy.md "Learnt profiles")."""

    min_requests: float = 100.0
    steady_tolerance: float = 0.25  # two consecutive polls agree within this share
    stale_after_seconds: float = 1800.0
    window_seconds: float = 600.0


@dataclass(frozen=True, slots=True)
class Policies:
    """Every component's policy, built together from one settings object."""

    placement: PlacementPolicy
    node_facts: NodeFactsPolicy
    gravity: GravityPolicy
    gang: GangPolicy


class PolicySource(Protocol):
    """What a part reads of the settings: its policies (app/config/settings.py's Settings is one). Parts below
    the settings file in the layering (README, "Layout") take this, never the file's type."""

    def policies(self) -> Policies: ...


def tier_names(fabric_tiers: tuple[tuple[str, ...], ...]) -> tuple[str, ...]:
    """Human names of the topology tiers a gang plan is described in."""
    names = ["NVLink domain"]
    for i, keys in enumerate(fabric_tiers):
        names.append("zone" if ZONE_LABEL in keys else f"fabric tier {i}")
    return tuple(names)
