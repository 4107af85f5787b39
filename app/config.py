"""Typed settings: one object built from an optional YAML file, then environment (``LLMP_*``).

Invalid configuration fails at start with a message that names the offending key, so an operator
never runs a scheduler with silently defaulted policy.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from app.core.datafile import load_user_yaml
from app.core.live_profiles import LiveProfileBook
from app.core.policy import (
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
from app.core.profiles import ProfileBook, ProfileError
from app.core.ranking import ScoreMapping
from app.core.serving_model import (
    DEFAULT_CONFIDENCE,
    QUANTILE_LEVELS,
    ServingCalibration,
    default_calibration,
)

__all__ = ["ConfigError", "NodeLabelKeys", "Settings", "StageWeights", "TierBandwidth", "load_settings"]

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

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    prometheus_url: str = Field(min_length=1, pattern=r"^https?://")
    interval_seconds: float = Field(60.0, ge=1, le=3600)
    window_seconds: float = Field(600.0, ge=30, le=86400)
    timeout_seconds: float = Field(2.0, gt=0, le=30)
    # Requests (first tokens) a key needs in the window before its figures may become a profile.
    min_requests: int = Field(100, ge=1)
    # Two consecutive polls must agree within this share before a learnt profile applies.
    steady_tolerance: float = Field(0.25, gt=0, le=1)
    stale_after_seconds: float = Field(1800.0, gt=0, le=7 * 86400)
    # The labels the scrape configuration puts the pod's namespace and name in.
    namespace_label: str = Field("namespace", min_length=1)
    pod_label: str = Field("pod", min_length=1)
    engines: tuple[Literal["vllm", "sglang", "tgi"], ...] = Field(("vllm", "sglang", "tgi"), min_length=1)

    def learn_policy(self) -> LearnPolicy:
        return LearnPolicy(min_requests=self.min_requests, steady_tolerance=self.steady_tolerance,
                           stale_after_seconds=self.stale_after_seconds, window_seconds=self.window_seconds)


class Settings(BaseSettings):
    """Everything the service reads at start. YAML file first, then ``LLMP_`` environment variables."""

    # Frozen: components take their policies once (``policies()``); a setting changed afterwards
    # would silently reach some of them and not others.
    # No inf or NaN anywhere: an infinite weight or time limit makes every node tie or nothing
    # schedule, silently.
    model_config = SettingsConfigDict(
        env_prefix="LLMP_", env_nested_delimiter="__", extra="forbid", frozen=True, allow_inf_nan=False
    )

    host: str = "127.0.0.1"
    port: int = Field(8888, ge=1, le=65535)
    # Loopback by default: exposing metrics is a deployment decision (the chart sets 0.0.0.0).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9090, ge=0, le=65535)
    url_prefix: str = "/scheduler"
    # TLS for the verbs (docs/security.md): the serving certificate and key (PEM). With
    # tls_client_ca_file, a verb call must present a client certificate that CA signed
    # (kube-scheduler's, from the extender's tlsConfig): a certificate of another CA fails the TLS
    # handshake, none at all is answered 403. /healthz, /readyz and /explain need none (probes, and
    # explain has its own bearer-token check).
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    kubeconfig: str | None = None
    # "kubernetes": list+watch the API server; "none": serve only from request bodies (non-cache mode).
    cluster_source: Literal["kubernetes", "none"] = "kubernetes"
    scheduler_name: str = "llm-placement"
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, le=1 << 30)
    # Connection limits of the verbs' and the metrics' HTTP servers (docs/extender-protocol.md,
    # "Connection limits"): a connection with no request under way is closed after the idle
    # timeout, a request must arrive whole within the request timeout of its first byte, and a
    # request head over max_header_bytes is answered 431. kube-scheduler sends each request at once.
    http_idle_timeout_seconds: float = Field(5.0, gt=0, le=3600)
    http_request_timeout_seconds: float = Field(10.0, gt=0, le=3600)
    http_max_header_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    gil_switch_interval_seconds: float = Field(0.0005, gt=0, le=0.1)

    labels: NodeLabelKeys = NodeLabelKeys()
    weights: dict[str, StageWeights] = Field(default_factory=_default_weights)
    # How weighted totals become kube-scheduler's 0-10: "rank" bands keep every difference in order
    # (docs/scoring.md); "linear" is round(10 x total), which rounds small preferences away.
    score_mapping: ScoreMapping = ScoreMapping.RANK
    # A GPU pod never opens a whole node while a partly used node of the same shape can take it
    # (docs/scoring.md): off only to measure what the guard is worth.
    whole_node_guard: bool = True
    # The guard across GPU shapes (docs/scoring.md, "Across shapes"): a partly used node of at least as
    # good hardware takes a GPU pod instead of a whole node being opened when its price premium is
    # below this share of the price of the GPUs the whole node would strand. 0 (default): same shape
    # only, so the cheapest GPU that meets a pod's needs keeps deciding the type.
    stranded_idle_share: float = Field(0.0, ge=0, le=1)
    # /explain shows where pods run: "kubernetes" lets only callers whose bearer token may get the
    # pod read it (TokenReview + SubjectAccessReview); "none" leaves it open (no API server to ask).
    explain_auth: Literal["kubernetes", "none"] = "kubernetes"
    # auto: filter answers only our best node(s), one when the pod has no soft in-tree preference
    # (docs/scoring.md); off: every feasible node, and prioritize ranks them.
    filter_to_best: Literal["auto", "off"] = "auto"
    tier_bandwidth_gbps: TierBandwidth = TierBandwidth()

    # Fraction of GPU memory kept free (fragmentation, CUDA context, allocator slack).
    # At most half: above that no GPU holds what its own memory says it holds.
    memory_headroom: float = Field(0.1, ge=0, le=0.5)
    # Alignment batches vary; keep more headroom than the estimate.
    alignment_extra_headroom: float = Field(0.15, ge=0, le=1)
    # Defaults for pods that leave these out: past the longest context any model serves (10M tokens)
    # or 65,536 sequences at once the KV-cache estimate outgrows every GPU, and no un-annotated
    # serving pod could be placed.
    default_context_tokens: int = Field(4096, gt=0, le=10_000_000)
    # A serving pod without a `concurrency` annotation is judged at one request at a time: the load
    # of the single-client measurements engines publish, which such a pod's targets are usually
    # read from (docs/stage-policy.md, "Default load"). A pod serving more states it.
    default_concurrency: int = Field(1, gt=0, le=65_536)
    # Latency an interactive (chat) service should reach when the pod sets no max-ms-per-token:
    # ~20 tokens/s, faster than people read. A soft target: slower nodes score lower, not zero.
    # 1 ms (faster than any GPU decodes) to 10 s per token; outside that the target means nothing.
    default_interactive_ms_per_token: float = Field(50.0, ge=1, le=10_000)
    # Hold such a pod to that target in filter too, but only when some candidate node meets it
    # (otherwise the fastest available still serves it, scored lower): docs/stage-policy.md.
    default_target_filter: bool = True
    # The serving model's fitted parameters (efficiencies, per-step floors, all-reduce latencies),
    # as written by `llm-placement calibrate` from your own measurements; none: the shipped
    # calibration from the packaged corpus (docs/stage-policy.md, "The serving model").
    serving_calibration_file: str | None = None
    # How sure the filter must be that an estimated serving pod meets its latency targets: the
    # estimate is multiplied by this quantile of its group's cross-validated measured / estimate
    # before it is compared with the target (docs/stage-policy.md, "Target decision"). Within the
    # levels the calibration records (0.5-0.99); higher refuses more targets the hardware meets.
    # The default's rule: serving_model.DEFAULT_CONFIDENCE.
    serving_confidence: float = Field(DEFAULT_CONFIDENCE, ge=QUANTILE_LEVELS[0], le=QUANTILE_LEVELS[-1])
    # Measured serving profiles (YAML or JSON) that replace the estimates for the pods they match:
    # docs/stage-policy.md, "Measured profiles". Read and validated once, at start.
    profiles_file: str | None = None
    # Learn serving profiles from the engines' own latency metrics in Prometheus (opt-in):
    # docs/stage-policy.md, "Learnt profiles".
    live_profiles: LiveProfileSettings | None = None
    cpu_stages_may_use_gpu_nodes: bool = False
    # Prices per hour up to $1,000: more overflows nothing, but is a unit mistake (cents, per month).
    default_cpu_hourly_cost: float = Field(0.05, ge=0, le=MAX_HOURLY_COST)
    # Per GPU-hour for GPUs missing from the catalog (conservative: priced like a large GPU).
    unknown_gpu_hourly_cost: float = Field(4.0, ge=0, le=MAX_HOURLY_COST)

    # Must outlast the bind barrier (checked below), else a gang's GPUs are released while its
    # members still wait to bind. At most a day: a dead gang holds its GPUs that long.
    gang_reservation_ttl_seconds: float = Field(120.0, gt=0, le=86_400)
    # Below kube-scheduler's bind timeout in practice (httpTimeout, 5 s in our manifests).
    gang_bind_timeout_seconds: float = Field(3.0, gt=0, le=600)
    # A filter after this long without one first adopts the gang plans persisted on pending members:
    # a standby replica taking over from a dead leader (docs/gangs.md, "Two replicas").
    gang_takeover_idle_seconds: float = Field(10.0, gt=0, le=86_400)
    # The starvation bound: the first gang of the gang queue that has waited this long without a
    # plan keeps whole nodes for itself as they free, so later work cannot keep overtaking it; it
    # then starts once the work on those nodes ends. Costs the held GPUs' idle time while they
    # drain (docs/gangs.md, "Starvation bound"). 0: hold at once. At most a day.
    gang_hold_after_seconds: float = Field(3600.0, ge=0, le=86_400)
    # A gang still missing members this long after its first member's creation is reported: a
    # warning event on its pods and a metric (docs/gangs.md, "Incomplete gangs").
    gang_incomplete_warn_seconds: float = Field(600.0, gt=0, le=7 * 86_400)
    # The percentageOfNodesToScore kube-scheduler runs with (the chart's configuration: 100; 0: its
    # adaptive default). A gang member's planned node missing from an offer that may be a sample
    # does not cost the gang its plan (docs/gangs.md, "Offers that are a part of the cluster").
    scheduler_percentage_of_nodes_to_score: int = Field(100, ge=0, le=100)
    # The solve runs beside filter calls; a minute is already far past any useful improvement.
    solver_time_limit_seconds: float = Field(0.5, gt=0, le=60)
    producer_memory_seconds: float = Field(3600.0, ge=0, le=30 * 86_400)
    # Data gravity: a transfer of about this many seconds is hardly worth anything, so reading 14 GB
    # locally instead of over the leaf (a second either way) does not outweigh packing or price,
    # while a cross-zone read of the same data (~15 s) still does (docs/data-gravity.md). 0: the
    # pure ratio, where any speed-up counts fully.
    gravity_negligible_seconds: float = Field(10.0, ge=0, le=86_400)

    _policies: Policies | None = PrivateAttr(default=None)
    _profiles: ProfileBook | None = PrivateAttr(default=None)
    _calibration: ServingCalibration = PrivateAttr(default_factory=default_calibration)

    @model_validator(mode="before")
    @classmethod
    def _hold_for_oldest(cls, data: Any) -> Any:
        # The former on/off switch of the same hold: true held at once, false never (the longest
        # bound there is now). Read, so configurations naming it keep their meaning.
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "gang_hold_for_oldest" not in data and "LLMP_GANG_HOLD_FOR_OLDEST" in os.environ:
            # Not a field any more, so the environment source would pass it over in silence.
            data["gang_hold_for_oldest"] = os.environ["LLMP_GANG_HOLD_FOR_OLDEST"]
        if "gang_hold_for_oldest" in data:
            old = str(data.pop("gang_hold_for_oldest")).strip().lower()
            if old not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError(f"gang_hold_for_oldest: {old!r} is not a boolean; it is replaced by "
                                 "gang_hold_after_seconds (docs/gangs.md, \"Starvation bound\")")
            data.setdefault("gang_hold_after_seconds", 0.0 if old in ("true", "1", "yes", "on") else 86_400.0)
        return data

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
                default_target_filter=self.default_target_filter,
                serving=self._calibration,
                serving_confidence=self.serving_confidence,
                profiles=self._profiles if self.live_profiles is None
                else LiveProfileBook(self.live_profiles.learn_policy(), file=self._profiles),
            )
            scoring = ScoringPolicy(
                weights=MappingProxyType(dict(self.weights)),
                memory_headroom=self.memory_headroom,
                default_interactive_ms_per_token=self.default_interactive_ms_per_token,
                score_mapping=self.score_mapping,
                whole_node_guard=self.whole_node_guard,
                stranded_idle_share=self.stranded_idle_share,
            )
            self._policies = Policies(
                placement=PlacementPolicy(feasibility, scoring, tuple(self.labels.gpu_resource),
                                          filter_to_best=self.filter_to_best == "auto"),
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
        # Environment overrides the file (init kwargs carry the file's content).
        return (env_settings, init_settings)


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Load settings from ``path`` (or ``$LLMP_CONFIG``) and the environment; raise ConfigError."""
    path = path or os.environ.get("LLMP_CONFIG")
    data: dict[str, Any] = {}
    if path:
        try:
            # The same reader as every file a user hands the product: no aliases (a few hundred
            # bytes of nested anchors expand to gigabytes), a size cap, nesting caught.
            loaded = load_user_yaml(path, ConfigError, MAX_CONFIG_BYTES)
        except ConfigError as exc:
            raise ConfigError(f"cannot read config file {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping")
        data = loaded or {}
    data.update(overrides)
    data, problems = _without_unknown_stages(data)
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


def _without_unknown_stages(data: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A file's unknown stages under ``weights``, each named by its path, and the data without them,
    so the known stages' weights are checked in the same pass (the validator only sees the whole
    mapping; it still refuses unknown stages that arrive through the environment)."""
    weights = data.get("weights")
    if not isinstance(weights, dict) or set(weights) <= set(STAGES):
        return data, ()
    problems = tuple(f"weights.{stage}: unknown stage; expected one of {', '.join(STAGES)}"
                     for stage in weights if stage not in STAGES)
    return {**data, "weights": {k: v for k, v in weights.items() if k in STAGES}}, problems
