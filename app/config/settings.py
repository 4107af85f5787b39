"""Typed settings: one versioned object built from an optional YAML file, then environment (``LLMP_*``).

The file is an ``ExtenderConfiguration`` of ``config.llm-placement.io/v1`` (docs/configuration.md,
generated from the field docstrings below). Invalid configuration fails at start with one line per
bad field naming its path, so an operator never runs a scheduler with silently defaulted policy.
Switches that exist to compare behaviours are feature gates with the version they go in
(``FEATURE_GATES``); names the file no longer uses are read, with a warning, for one more version
(``RENAMED``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from app.base.datafile import load_user_yaml
from app.config.policy import (
    FeasibilityPolicy,
    GangPolicy,
    GravityPolicy,
    LearnPolicy,
    NodeFactsPolicy,
    NodeLabelKeys,
    PlacementPolicy,
    Policies,
    ScoringPolicy,
    StageWeights,
    TierBandwidth,
    tier_names,
)
from app.placement.ranking import ScoreMapping
from app.serving.live_profiles import LiveProfileBook
from app.serving.model import (
    DEFAULT_CONFIDENCE,
    QUANTILE_LEVELS,
    ServingCalibration,
    default_calibration,
)
from app.serving.profiles import ProfileBook, ProfileError

__all__ = [
    "API_VERSION",
    "FEATURE_GATES",
    "KIND",
    "RENAMED",
    "ConfigDeprecationWarning",
    "ConfigError",
    "FeatureGate",
    "NodeLabelKeys",
    "Renamed",
    "Settings",
    "StageWeights",
    "TierBandwidth",
    "dump_settings",
    "load_settings",
]

# The file's schema, versioned the way kube-scheduler's KubeSchedulerConfiguration
# (kubescheduler.config.k8s.io/v1, helm/llm-placement/files/scheduler-config.yaml) and Kueue's
# Configuration (config.kueue.x-k8s.io, https://kueue.sigs.k8s.io/docs/reference/kueue-config.v1beta2/)
# are: a group of the product's own domain, a version, a kind naming the component
# (docs/configuration.md).
API_VERSION = "config.llm-placement.io/v1"
KIND = "ExtenderConfiguration"
# Files without apiVersion/kind, and the old names of RENAMED, are read until this version.
UNVERSIONED_UNTIL = "0.2.0"

MAX_HOURLY_COST = 1000.0  # dollars per hour for one GPU or one CPU node
STAGES = ("data-prep", "pretraining", "alignment", "deployment", "serving")


# A config file is a few KB; a profiles table lives in its own file (profiles_file).
MAX_CONFIG_BYTES = 4 << 20


class ConfigError(ValueError):
    """Configuration could not be loaded; the message names the key.

    ``problems`` holds one ``path: reason`` line per bad field (``llm-placement config validate``
    prints them one a line); the message joins them.
    """

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)


# Pydantic's wording for the bounds and unknown keys, said the way a settings file reads.
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
_BOUND_KEYS = {"greater_than_equal": "ge", "greater_than": "gt", "less_than_equal": "le", "less_than": "lt"}


def _problem(err: Any) -> str:
    """One ``path: reason`` line for one validation error (a check across settings: its message)."""
    key = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    if kind in _BOUNDS:
        bound = err["ctx"][_BOUND_KEYS[kind]]
        msg = f"must be {_BOUNDS[kind]} {f'{bound:g}' if isinstance(bound, float) else bound}"
    elif kind == "extra_forbidden":
        msg = "unknown key"
    elif kind == "missing":
        msg = "required"
    else:
        msg = err["msg"].removeprefix("Value error, ")
    return f"{key}: {msg}" if key else msg


class ConfigDeprecationWarning(FutureWarning):
    """A file or variable uses a form that still loads but goes in a stated version. A FutureWarning
    so that Python shows it by default: the operator running the extender is its audience."""


@dataclass(frozen=True, slots=True)
class FeatureGate:
    """A behaviour kept switchable only to compare it with the one it replaced, Kubernetes-style:
    alpha gates default off, beta gates default on; in ``until`` the gate goes, and with it the
    losing code path (a beta gate's behaviour stays, an alpha gate's is promoted or removed)."""

    stage: Literal["alpha", "beta"]
    default: bool
    until: str
    doc: str


FEATURE_GATES: dict[str, FeatureGate] = {
    "WholeNodeGuard": FeatureGate(
        "beta", True, "0.3.0",
        "A GPU pod never opens a whole node while a partly used node of the same shape can take it "
        "(docs/scoring.md, \"The whole-node guard\"). Off only to measure what the guard is worth."),
    "CrossShapeGuard": FeatureGate(
        "alpha", False, "0.3.0",
        "The whole-node guard across GPU shapes: a partly used node of at least as good hardware "
        "stands in for a whole node when its price premium is below half the price of the GPUs the "
        "whole node would strand (docs/scoring.md, \"Across shapes\"). Measured to buy little; off "
        "keeps the cheapest GPU that meets a pod's needs deciding the type."),
    "ScoreRankBands": FeatureGate(
        "beta", True, "0.3.0",
        "Weighted totals become kube-scheduler's 0-10 by rank of distinct totals, so every "
        "difference stays in order (docs/scoring.md); off: round(10 x total), the old mapping, which "
        "rounds small preferences away (kept for comparison only)."),
    "FilterToBest": FeatureGate(
        "beta", True, "0.3.0",
        "Filter answers only the extender's best node(s), one when the pod has no soft in-tree "
        "preference (docs/scoring.md); off: every feasible node, and prioritize ranks them."),
    "DefaultTargetFilter": FeatureGate(
        "beta", True, "0.3.0",
        "An interactive serving pod without max-ms-per-token is kept off nodes slower than "
        "default_interactive_ms_per_token when another candidate meets it (docs/stage-policy.md); "
        "off: the default target is a preference only."),
}
# The guard across shapes lets a partly used node's price premium reach this share of the price of
# the GPUs a whole node would strand: the value the pipeline replay measured (BENCHMARKS.md).
CROSS_SHAPE_IDLE_SHARE = 0.5

_BOOL = TypeAdapter(bool)


def _share(v: Any) -> bool:
    share = TypeAdapter(float).validate_python(v)
    if not 0 <= share <= 1:
        raise ValueError(f"must be between 0 and 1, not {share:g}")
    return share > 0


def _choice(on: str, off: str) -> Callable[[Any], bool]:
    def parse(v: Any) -> bool:
        if str(v) not in (on, off):
            raise ValueError(f"must be {on!r} or {off!r}, not {v!r}")
        return str(v) == on
    return parse


@dataclass(frozen=True, slots=True)
class Renamed:
    """A name the file no longer uses: the gate it became, or the setting its value now sets (neither:
    removed), and how its value reads."""

    gate: str | None
    parse: Callable[[Any], bool]
    schema: dict[str, Any]  # what the chart's values.schema.json still accepts under the old name
    note: str = ""
    setting: str | None = None
    to_setting: Callable[[bool], Any] | None = None


_FLAG = {"type": "boolean"}
RENAMED: dict[str, Renamed] = {
    "whole_node_guard": Renamed("WholeNodeGuard", _BOOL.validate_python, _FLAG),
    "stranded_idle_share": Renamed("CrossShapeGuard", _share, {"type": "number", "minimum": 0, "maximum": 1},
                                   f"any share above 0 turns it on, at {CROSS_SHAPE_IDLE_SHARE:g}"),
    "score_mapping": Renamed("ScoreRankBands", _choice("rank", "linear"),
                             {"type": "string", "enum": ["rank", "linear"]}, "rank: true, linear: false"),
    "filter_to_best": Renamed("FilterToBest", _choice("auto", "off"),
                              {"type": "string", "enum": ["auto", "off"]}, "auto: true, off: false"),
    "default_target_filter": Renamed("DefaultTargetFilter", _BOOL.validate_python, _FLAG),
    "gang_hold_for_oldest": Renamed(
        None, _BOOL.validate_python, _FLAG, "true: 0, false: 86400, a day",
        setting="gang_hold_after_seconds", to_setting=lambda on: 0.0 if on else 86_400.0),
    "gil_switch_interval_seconds": Renamed(
        None, lambda v: True, {"type": "number"},
        "the extender sets Python's thread switch interval itself (0.5 ms)"),
}


def _renamed_message(old: str, rule: Renamed) -> str:
    if rule.setting is not None:
        return (f"{old} is deprecated: set {rule.setting} instead ({rule.note}); the old name is "
                f"accepted until {UNVERSIONED_UNTIL}")
    if rule.gate is None:
        return f"{old} is no longer read ({rule.note}); remove it (accepted until {UNVERSIONED_UNTIL})"
    how = f" ({rule.note})" if rule.note else ""
    return (f"{old} is deprecated: set feature_gates.{rule.gate} instead{how}; the old name is "
            f"accepted until {UNVERSIONED_UNTIL}")


def _translate_renamed(data: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``data`` with each old name of RENAMED turned into its feature gate (a gate set under
    ``feature_gates`` wins over an old name), a deprecation warning per old name, and one
    ``old: reason`` problem per old name whose value does not read."""
    old_names = [k for k in data if k in RENAMED]
    if not old_names:
        return data, ()
    data = dict(data)
    gates = data.get("feature_gates")
    gates = dict(gates) if isinstance(gates, dict) else gates
    problems: list[str] = []
    for old in old_names:
        rule, value = RENAMED[old], data.pop(old)
        warnings.warn(_renamed_message(old, rule), ConfigDeprecationWarning, stacklevel=4)
        try:
            on = rule.parse(value)
        except (ValueError, ValidationError) as exc:
            reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            problems.append(f"{old}: {reason}")
            continue
        if rule.setting is not None and rule.to_setting is not None:
            data.setdefault(rule.setting, rule.to_setting(on))
            continue
        if rule.gate is None:
            continue
        gates = {} if gates is None else gates
        if isinstance(gates, dict) and not any(_gate_name(g) == rule.gate for g in gates):
            gates[rule.gate] = on
    if gates:
        data["feature_gates"] = gates
    return data, tuple(problems)


def _gate_name(name: Any) -> str | None:
    """The gate ``name`` spells, whatever its case (environment variables arrive lower-cased)."""
    by_lower = {g.lower(): g for g in FEATURE_GATES}
    return by_lower.get(str(name).lower())


def _default_weights() -> dict[str, StageWeights]:
    # Why these shapes: serving is memory-bound and sold per token, so bandwidth and cost dominate;
    # training pays for idle GPUs in lockstep, so packing (keep whole nodes free) and gravity matter;
    # CPU-bound stages mostly care about landing on the right class of node.
    return {
        "data-prep": StageWeights(
            memory_fit=0, bandwidth=0, cost=1, separation=0.5, packing=0.5, node_class=3, gravity=2
        ),
        # Gravity 3 for training: measured in bench/data_gravity.py, 2 let small SFT jobs drift to
        # cheap GPUs far from their checkpoint; 3 co-locates every edge capacity allows.
        "pretraining": StageWeights(
            memory_fit=1, bandwidth=0.5, cost=0.5, separation=1, packing=2, node_class=0, gravity=3
        ),
        "alignment": StageWeights(
            memory_fit=2, bandwidth=0.5, cost=1, separation=1, packing=1.5, node_class=0, gravity=3
        ),
        "deployment": StageWeights(
            memory_fit=1, bandwidth=0, cost=1.5, separation=0.5, packing=0.5, node_class=3, gravity=2
        ),
        "serving": StageWeights(
            memory_fit=1.5, bandwidth=1.5, cost=3, separation=1, packing=0.5, node_class=0, gravity=1
        ),
    }


class LiveProfileSettings(BaseModel):
    """Where the serving engines' latency histograms are, and when a measurement counts."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True)

    prometheus_url: str = Field(min_length=1, pattern=r"^https?://")
    """Base URL of the Prometheus that scrapes the serving engines (required)."""
    interval_seconds: float = Field(60.0, ge=1, le=3600)
    """How often the histograms are read."""
    window_seconds: float = Field(600.0, ge=30, le=86400)
    """The window each reading covers."""
    timeout_seconds: float = Field(2.0, gt=0, le=30)
    """Timeout of one Prometheus query."""
    min_requests: int = Field(100, ge=1)
    """Requests (first tokens) a key needs in the window before its figures may become a profile."""
    steady_tolerance: float = Field(0.25, gt=0, le=1)
    """Two consecutive readings must agree within this share before a learnt profile applies."""
    stale_after_seconds: float = Field(1800.0, gt=0, le=7 * 86400)
    """A learnt profile not confirmed for this long stops applying."""
    namespace_label: str = Field("namespace", min_length=1)
    """The label the scrape configuration puts the pod's namespace in."""
    pod_label: str = Field("pod", min_length=1)
    """The label the scrape configuration puts the pod's name in."""
    engines: tuple[Literal["vllm", "sglang", "tgi"], ...] = Field(("vllm", "sglang", "tgi"), min_length=1)
    """The engines whose metric names are read."""

    def learn_policy(self) -> LearnPolicy:
        return LearnPolicy(min_requests=self.min_requests, steady_tolerance=self.steady_tolerance,
                           stale_after_seconds=self.stale_after_seconds, window_seconds=self.window_seconds)


class Settings(BaseSettings):
    """Everything the service reads at start. YAML file first, then ``LLMP_`` environment variables.

    Each field's docstring is its entry in docs/configuration.md and the chart's values.schema.json
    (both generated: ``python -m scripts.gen_config_docs``)."""

    # Frozen: components take their policies once (``policies()``); a setting changed afterwards
    # would silently reach some of them and not others.
    # No inf or NaN anywhere: an infinite weight or time limit makes every node tie or nothing
    # schedule, silently.
    model_config = SettingsConfigDict(
        env_prefix="LLMP_", env_nested_delimiter="__", extra="forbid", frozen=True, allow_inf_nan=False,
        use_attribute_docstrings=True,
    )

    host: str = "127.0.0.1"
    """Listen address of the verbs (filter, prioritize, bind, preempt), /healthz, /readyz and /explain."""
    port: int = Field(8888, ge=1, le=65535)
    """Listen port of the verbs."""
    # Loopback by default: exposing metrics is a deployment decision (the chart sets 0.0.0.0).
    metrics_host: str = "127.0.0.1"
    """Listen address of Prometheus /metrics."""
    metrics_port: int = Field(9090, ge=0, le=65535)
    """Listen port of /metrics; 0: no metrics server."""
    url_prefix: str = "/scheduler"
    """Path the verbs are served under (kube-scheduler's urlPrefix)."""
    tls_cert_file: str | None = None
    """Serving certificate of the verbs (PEM); with tls_key_file, the verbs are served over TLS
    (docs/security.md)."""
    tls_key_file: str | None = None
    """Key of tls_cert_file (PEM)."""
    tls_client_ca_file: str | None = None
    """With it, a verb call must present a client certificate this CA signed (kube-scheduler's): one of
    another CA fails the handshake, none at all is answered 403. /healthz, /readyz and /explain need
    none (docs/security.md)."""
    kubeconfig: str | None = None
    """Out-of-cluster kubeconfig; none: KUBECONFIG, ~/.kube/config, then the in-cluster ServiceAccount."""
    cluster_source: Literal["kubernetes", "none"] = "kubernetes"
    """kubernetes: list and watch the API server; none: serve only from request bodies (non-cache mode)."""
    scheduler_name: str = "llm-placement"
    """The schedulerName of the pods this extender places (gangs of other schedulers are left alone)."""
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, le=1 << 30)
    """Largest request body a verb reads."""
    # kube-scheduler sends each request at once, so the connection limits never touch it.
    http_idle_timeout_seconds: float = Field(5.0, gt=0, le=3600)
    """A connection with no request under way is closed after this long (docs/extender-protocol.md,
    "Connection limits")."""
    http_request_timeout_seconds: float = Field(10.0, gt=0, le=3600)
    """A request must arrive whole within this long of its first byte, else its connection is closed."""
    http_max_header_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    """A request head over this size is answered 431."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of the extender."""

    labels: NodeLabelKeys = NodeLabelKeys()
    """Node label keys the node facts are read from, first hit wins (docs/node-facts.md)."""
    weights: dict[str, StageWeights] = Field(default_factory=_default_weights)
    """Weights of the prioritize terms per stage (docs/scoring.md). A stage or term left out keeps its
    default: overriding one term of one stage keeps that stage's other terms."""
    explain_auth: Literal["kubernetes", "none"] = "kubernetes"
    """/explain shows where pods run: kubernetes lets only callers whose bearer token may get the pod
    read it (TokenReview and SubjectAccessReview); none leaves it open (no API server to ask)."""
    tier_bandwidth_gbps: TierBandwidth = TierBandwidth()
    """GB/s assumed between a producer and a consumer at each distance (docs/data-gravity.md)."""

    # At most half: above that no GPU holds what its own memory says it holds.
    memory_headroom: float = Field(0.1, ge=0, le=0.5)
    """Share of GPU memory kept free (fragmentation, CUDA context, allocator slack)."""
    alignment_extra_headroom: float = Field(0.15, ge=0, le=1)
    """Further headroom for alignment pods, whose batches vary more than the estimate."""
    # Past the longest context any model serves (10M tokens) or 65,536 sequences at once the KV-cache
    # estimate outgrows every GPU, and no un-annotated serving pod could be placed.
    default_context_tokens: int = Field(4096, gt=0, le=10_000_000)
    """Context length of a serving pod that states none."""
    default_concurrency: int = Field(1, gt=0, le=65_536)
    """Concurrent requests of a serving pod without a concurrency annotation: one, the load of the
    single-client measurements engines publish (docs/stage-policy.md, "Default load")."""
    # ~20 tokens/s, faster than people read. 1 ms (faster than any GPU decodes) to 10 s per token;
    # outside that the target means nothing.
    default_interactive_ms_per_token: float = Field(50.0, ge=1, le=10_000)
    """Latency an interactive serving pod without max-ms-per-token is held to: slower nodes score lower,
    and with the DefaultTargetFilter gate are filtered out when another node meets it."""
    serving_calibration_file: str | None = None
    """The serving model's fitted parameters as written by `llm-placement calibrate` from your own
    measurements; none: the shipped calibration (docs/stage-policy.md, "The serving model")."""
    # The default's rule: serving_model.DEFAULT_CONFIDENCE.
    serving_confidence: float = Field(DEFAULT_CONFIDENCE, ge=QUANTILE_LEVELS[0], le=QUANTILE_LEVELS[-1])
    """How sure the filter must be that an estimated serving pod meets its latency targets: the
    estimate times this quantile of its group's cross-validated measured / estimate must be within the
    target (docs/stage-policy.md, "Target decision"). Higher refuses more targets the hardware meets."""
    profiles_file: str | None = None
    """Measured serving profiles (YAML or JSON) that replace the estimates for the pods they match,
    read and checked once at start (docs/stage-policy.md, "Measured profiles")."""
    live_profiles: LiveProfileSettings | None = None
    """Learn serving profiles from the engines' own latency metrics in Prometheus; none: off
    (docs/stage-policy.md, "Learnt profiles")."""
    cpu_stages_may_use_gpu_nodes: bool = False
    """Let data-prep and deployment pods (CPU stages) run on GPU nodes."""
    # Prices per hour up to $1,000: more overflows nothing, but is a unit mistake (cents, per month).
    default_cpu_hourly_cost: float = Field(0.05, ge=0, le=MAX_HOURLY_COST)
    """Dollars per hour of a CPU node without a price label."""
    unknown_gpu_hourly_cost: float = Field(4.0, ge=0, le=MAX_HOURLY_COST)
    """Dollars per GPU-hour of a GPU missing from the catalog (priced like a large GPU, conservatively)."""

    # At most a day: a dead gang holds its GPUs that long.
    gang_reservation_ttl_seconds: float = Field(120.0, gt=0, le=86_400)
    """How long a gang's reserved GPUs wait for its members to bind; must outlast
    gang_bind_timeout_seconds (docs/gangs.md)."""
    # Below kube-scheduler's bind timeout in practice (httpTimeout, 5 s in our manifests).
    gang_bind_timeout_seconds: float = Field(3.0, gt=0, le=600)
    """How long a gang member's bind waits for the rest of its gang (the bind barrier)."""
    gang_takeover_idle_seconds: float = Field(10.0, gt=0, le=86_400)
    """A filter after this long without one first adopts the gang plans persisted on pending members: a
    standby replica taking over from a dead leader (docs/gangs.md, "Two replicas")."""
    # At most a day: past that the bound no longer bounds anything a user would wait for.
    gang_hold_after_seconds: float = Field(3600.0, ge=0, le=86_400)
    """The starvation bound: the first gang of the gang queue that has waited this long without a plan
    keeps whole nodes for itself as they free, so later work cannot keep overtaking it, and starts once
    the work on those nodes ends; costs the held GPUs' idle time while they drain (docs/gangs.md,
    "Starvation bound"). 0: hold at once."""
    gang_incomplete_warn_seconds: float = Field(600.0, gt=0, le=7 * 86_400)
    """A gang still missing members this long after its first member's creation is reported: a warning
    event on its pods and a metric (docs/gangs.md, "Incomplete gangs")."""
    scheduler_percentage_of_nodes_to_score: int = Field(100, ge=0, le=100)
    """The percentageOfNodesToScore kube-scheduler runs with (the chart's: 100; 0: its adaptive
    default): a gang member's planned node missing from an offer that may be a sample does not cost the
    gang its plan (docs/gangs.md, "Offers that are a part of the cluster")."""
    # The solve runs beside filter calls; a minute is already far past any useful improvement.
    solver_time_limit_seconds: float = Field(0.5, gt=0, le=60)
    """Time limit of one gang placement solve."""
    producer_memory_seconds: float = Field(3600.0, ge=0, le=30 * 86_400)
    """How long after a producer pod finished its output still counts as where its data is (data
    gravity, docs/data-gravity.md)."""
    # Reading 14 GB locally instead of over the leaf (a second either way) does not outweigh packing
    # or price, while a cross-zone read of the same data (~15 s) still does (docs/data-gravity.md).
    gravity_negligible_seconds: float = Field(10.0, ge=0, le=86_400)
    """A transfer of about this many seconds is hardly worth anything to data gravity; 0: the pure
    ratio, where any speed-up counts fully."""
    feature_gates: dict[str, bool] = Field(default_factory=dict)
    """Switches kept only to compare a behaviour with the one it replaced, by gate name; a gate left
    out keeps its default. Each goes in a stated version (docs/configuration.md, "Feature gates")."""

    _policies: Policies | None = PrivateAttr(default=None)
    _profiles: ProfileBook | None = PrivateAttr(default=None)
    _calibration: ServingCalibration = PrivateAttr(default_factory=default_calibration)

    @model_validator(mode="after")
    def _gang_reservation_outlasts_bind(self) -> Settings:
        # A reservation expiring before the bind barrier gives up frees a gang's GPUs to other pods
        # while its first members wait for the rest: the gang could never bind whole.
        if self.gang_reservation_ttl_seconds <= self.gang_bind_timeout_seconds:
            raise ValueError(
                f"gang_reservation_ttl_seconds ({self.gang_reservation_ttl_seconds:g}) must be longer "
                f"than gang_bind_timeout_seconds ({self.gang_bind_timeout_seconds:g})")
        return self

    @model_validator(mode="after")
    def _tls_files(self) -> Settings:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together: set both or neither")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file: client "
                             "certificates are only asked for over TLS")
        for key in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
            path = getattr(self, key)
            if path and not Path(path).is_file():
                raise ValueError(f"{key}: {path} is not a readable file")
        return self

    @model_validator(mode="after")
    def _load_profiles(self) -> Settings:
        # A bad profiles file fails the configuration, naming the entry and the field: a scheduler
        # must not run on silently ignored measurements.
        if self.profiles_file:
            try:
                self._profiles = ProfileBook.load(self.profiles_file)
            except ProfileError as exc:
                raise ValueError(f"profiles_file: {exc}") from None
        if self.serving_calibration_file:
            try:
                self._calibration = ServingCalibration.load(Path(self.serving_calibration_file))
            except ValueError as exc:
                raise ValueError(f"serving_calibration_file: {exc}") from None
        return self

    def gate(self, name: str) -> bool:
        """Whether feature gate ``name`` is on: as set under feature_gates, else its default."""
        return self.feature_gates.get(name, FEATURE_GATES[name].default)

    def policies(self) -> Policies:
        """Each pure component's own typed, immutable slice of these settings (built once)."""
        if self._policies is None:
            feasibility = FeasibilityPolicy(
                cpu_stages_may_use_gpu_nodes=self.cpu_stages_may_use_gpu_nodes,
                memory_headroom=self.memory_headroom,
                alignment_extra_headroom=self.alignment_extra_headroom,
                default_context_tokens=self.default_context_tokens,
                default_concurrency=self.default_concurrency,
                default_interactive_ms_per_token=self.default_interactive_ms_per_token,
                default_target_filter=self.gate("DefaultTargetFilter"),
                serving=self._calibration,
                serving_confidence=self.serving_confidence,
                profiles=self._profiles if self.live_profiles is None
                else LiveProfileBook(self.live_profiles.learn_policy(), file=self._profiles),
            )
            scoring = ScoringPolicy(
                weights=MappingProxyType(dict(self.weights)),
                memory_headroom=self.memory_headroom,
                default_interactive_ms_per_token=self.default_interactive_ms_per_token,
                score_mapping=ScoreMapping.RANK if self.gate("ScoreRankBands") else ScoreMapping.LINEAR,
                whole_node_guard=self.gate("WholeNodeGuard"),
                stranded_idle_share=CROSS_SHAPE_IDLE_SHARE if self.gate("CrossShapeGuard") else 0.0,
            )
            self._policies = Policies(
                placement=PlacementPolicy(feasibility, scoring, tuple(self.labels.gpu_resource),
                                          filter_to_best=self.gate("FilterToBest")),
                node_facts=NodeFactsPolicy(
                    self.labels, self.default_cpu_hourly_cost, self.unknown_gpu_hourly_cost
                ),
                gravity=GravityPolicy(
                    self.labels.fabric_tiers, self.tier_bandwidth_gbps, self.producer_memory_seconds,
                    self.gravity_negligible_seconds,
                ),
                gang=GangPolicy(
                    feasibility=feasibility,
                    tier_names=tier_names(self.labels.fabric_tiers),
                    reservation_ttl_seconds=self.gang_reservation_ttl_seconds,
                    bind_timeout_seconds=self.gang_bind_timeout_seconds,
                    solver_time_limit_seconds=self.solver_time_limit_seconds,
                    hold_after_seconds=self.gang_hold_after_seconds,
                    scheduler_name=self.scheduler_name,
                    incomplete_warn_seconds=self.gang_incomplete_warn_seconds,
                    percentage_of_nodes_to_score=self.scheduler_percentage_of_nodes_to_score,
                ),
            )
        return self._policies

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """Old names (RENAMED) from keyword arguments or the environment: their gates, and a warning."""
        if not isinstance(data, dict):
            return data
        data, problems = _translate_renamed(data)
        if problems:
            raise ValueError("; ".join(problems))
        return data

    @field_validator("feature_gates", mode="before")
    @classmethod
    def _known_gates(cls, v: Any) -> Any:
        """Gate names in any case (LLMP_FEATURE_GATES__WHOLENODEGUARD arrives lower-cased), each known."""
        if not isinstance(v, dict):
            return v
        unknown = sorted(str(k) for k in v if _gate_name(k) is None)
        if unknown:
            raise ValueError(f"unknown feature gate(s) {unknown}; known: {', '.join(FEATURE_GATES)}")
        return {_gate_name(k): on for k, on in v.items()}

    @field_validator("url_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        v = "/" + v.strip("/")
        return "" if v == "/" else v

    @field_validator("weights", mode="before")
    @classmethod
    def _stages(cls, v: Any) -> Any:
        """Overriding one term of one stage keeps that stage's other defaults (merge, not replace)."""
        if not isinstance(v, dict):
            return v
        unknown = sorted(set(v) - set(STAGES))
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; expected some of {list(STAGES)}")
        merged: dict[str, Any] = {k: w.model_dump() for k, w in _default_weights().items()}
        for stage, terms in v.items():
            if isinstance(terms, StageWeights):
                terms = terms.model_dump(exclude_unset=True)
            if not isinstance(terms, dict):
                raise ValueError(f"weights.{stage} must be a mapping of term to weight")
            merged[stage] = {**merged[stage], **terms}
        return merged

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment overrides the file (init kwargs carry the file's content); an old name in the
        # environment (LLMP_WHOLE_NODE_GUARD) still counts, below the new names.
        return (env_settings, _RenamedEnv(settings_cls), init_settings)


class _RenamedEnv(PydanticBaseSettingsSource):
    """``LLMP_<OLD NAME>`` variables of RENAMED, which the environment source no longer reads: without
    this an operator's old variable would be dropped silently instead of read with a warning."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        env = {k.upper(): v for k, v in os.environ.items()}
        return {old: env[f"LLMP_{old.upper()}"] for old in RENAMED if f"LLMP_{old.upper()}" in env}


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Load settings from ``path`` (or ``$LLMP_CONFIG``) and the environment; raise ConfigError with
    one ``path: reason`` problem per bad field. Deprecated forms (an unversioned file, an old name)
    load with a ConfigDeprecationWarning each."""
    path = path or os.environ.get("LLMP_CONFIG")
    data: dict[str, Any] = {}
    problems: tuple[str, ...] = ()
    if path:
        try:
            # The same reader as every file a user hands the product: no aliases (a few hundred
            # bytes of nested anchors expand to gigabytes), a size cap, nesting caught.
            loaded = load_user_yaml(path, ConfigError, MAX_CONFIG_BYTES)
        except ConfigError as exc:
            raise ConfigError(f"cannot read config file {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping")
        data, problems = _unversioned(loaded or {}, path)
    data.update(overrides)
    data, renamed = _translate_renamed(data)
    data, stages = _without_unknown(data, "weights", STAGES, "stage")
    data, gates = _without_unknown(data, "feature_gates", tuple(FEATURE_GATES), "feature gate", any_case=True)
    problems += renamed + stages + gates
    try:
        settings = Settings(**data)
    except SettingsError as exc:
        # A structured LLMP_* variable that is not valid JSON: one line naming it, no traceback.
        raise ConfigError(f"invalid configuration: {exc}") from None
    except ValidationError as exc:
        # A check across settings (no location) names its keys in its own message.
        problems += tuple(_problem(err) for err in exc.errors())
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems), problems)
    return settings


def _unversioned(data: dict[str, Any], path: str | Path) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The file's settings without apiVersion and kind, and a problem for a version or kind this
    build does not read. A file with neither is read as the current version, with a warning."""
    data = dict(data)
    version, kind = data.pop("apiVersion", None), data.pop("kind", None)
    if version is None and kind is None:
        warnings.warn(f"config file {path} has no apiVersion and kind: it is read as {API_VERSION} "
                      f"until {UNVERSIONED_UNTIL}; add `apiVersion: {API_VERSION}` and `kind: {KIND}`",
                      ConfigDeprecationWarning, stacklevel=3)
        return data, ()
    problems = []
    for key, value, expected, other in (("apiVersion", version, API_VERSION, "kind"),
                                        ("kind", kind, KIND, "apiVersion")):
        if value != expected:
            found = f"required with {other}" if value is None else f"{value!r} is not read"
            problems.append(f"{key}: {found}; expected {expected}")
    return data, tuple(problems)


def _without_unknown(data: dict[str, Any], key: str, known: tuple[str, ...], what: str,
                     any_case: bool = False) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A file's unknown entries under mapping ``key`` (stages of weights, feature gates), each named by
    its path, and the data without them, so the known entries are checked in the same pass (the
    field's validator only sees the whole mapping; it still refuses unknown entries that arrive
    through the environment)."""
    mapping = data.get(key)
    if not isinstance(mapping, dict):
        return data, ()
    fold = str.lower if any_case else str
    names = {fold(k) for k in known}
    unknown = [k for k in mapping if fold(str(k)) not in names]
    if not unknown:
        return data, ()
    problems = tuple(f"{key}.{k}: unknown {what}; expected one of {', '.join(known)}" for k in unknown)
    return {**data, key: {k: v for k, v in mapping.items() if k not in unknown}}, problems


def dump_settings(settings: Settings, changed_only: bool = False) -> str:
    """``settings`` as a versioned YAML file that ``load_settings`` reads back to equal settings;
    ``changed_only``: only the settings that differ from their defaults (a file to keep)."""
    values = settings.model_dump(mode="json", exclude_defaults=changed_only)
    if changed_only and "weights" in values:
        # A term left out reads back as its stage's default, not StageWeights' generic one.
        defaults = {stage: w.model_dump(mode="json") for stage, w in _default_weights().items()}
        changed = {stage: {t: v for t, v in settings.weights[stage].model_dump(mode="json").items()
                           if v != defaults[stage][t]} for stage in STAGES}
        values["weights"] = {stage: terms for stage, terms in changed.items() if terms}
        if not values["weights"]:
            del values["weights"]
    document = {"apiVersion": API_VERSION, "kind": KIND, **values}
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=1000)
