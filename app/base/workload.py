"""Workload spec: what a pod declares about itself, parsed and validated from its JSON.

Input is the plain pod dict exactly as kube-scheduler (or the API server) serialises it. Every
problem is collected so one event can name all of them; nothing here raises on odd input except
``WorkloadError``.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from app.base.bind_checks import Term, Toleration, required_terms_of, tolerations_of
from app.base.reasons import AnnotationProblem
from app.base.units import (
    parse_param_count,
    parse_positive_int,
    parse_positive_number,
    parse_quantity,
    quote,
)

PREFIX = "llm-placement.io/"
# The scheduling gate the chart's admission policy puts on gang members; the extender lifts it once
# every member exists, so an incomplete gang never enters kube-scheduler's queue (docs/gangs.md).
GANG_GATE = PREFIX + "gang-incomplete"
NATIVE_GANG_SOURCE = "spec.schedulingGroup"  # GangRef.source of the native Workload API
VOLCANO_GANG_SOURCE = "scheduling.k8s.io/group-name"  # GangRef.source of Volcano's annotation
# Keys under the prefix that the extender itself writes on pods (not typos when a pod carries them).
WRITTEN_KEYS: tuple[str, ...] = ("assigned-precision", "gang-plan", "gang-members", "gang-gathered",
                                  "gang-retry")
# Bounds on list annotations (docs/annotations.md, "Limits"): a list is parsed on every filter and
# each depends-on entry is resolved per request, so a 36,000-name value must be refused up front.
MAX_LIST_ITEMS = 256
MAX_NAME_CHARS = 317  # a namespace (63) + "/" + a DNS subdomain name (253)


class Stage(StrEnum):
    DATA_PREP = "data-prep"
    PRETRAINING = "pretraining"
    ALIGNMENT = "alignment"
    DEPLOYMENT = "deployment"
    SERVING = "serving"


STAGE_ALIASES: Mapping[str, Stage] = MappingProxyType({
    **{s.value: s for s in Stage},
    "dataprep": Stage.DATA_PREP,
    "pretrain": Stage.PRETRAINING,
    "sft": Stage.ALIGNMENT,
    "rlhf": Stage.ALIGNMENT,
    "dpo": Stage.ALIGNMENT,
    "finetune": Stage.ALIGNMENT,
    "quantize": Stage.DEPLOYMENT,
    "package": Stage.DEPLOYMENT,
    "inference": Stage.SERVING,
    "serve": Stage.SERVING,
    "eval": Stage.SERVING,
})

TRAINING_STAGES = frozenset({Stage.PRETRAINING, Stage.ALIGNMENT})
CPU_STAGES = frozenset({Stage.DATA_PREP, Stage.DEPLOYMENT})


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bytes_per_param(self) -> float:
        return _BYTES[self]


_BYTES = {
    Precision.FP32: 4.0,
    Precision.BF16: 2.0,
    Precision.FP16: 2.0,
    Precision.FP8: 1.0,
    Precision.INT8: 1.0,
    Precision.INT4: 0.5,
}


class FinetuneMethod(StrEnum):
    """How a training pod updates the model (docs/stage-policy.md, "Memory sizing")."""

    FULL = "full"  # every parameter trained: weights, gradients, fp32 master and Adam moments
    LORA = "lora"  # frozen base at its precision + small trainable adapters
    QLORA = "qlora"  # frozen base quantised to 4-bit NF4 + adapters


class ServingRole(StrEnum):
    """Which phase of inference a serving pod runs (disaggregated prefill/decode serving)."""

    PREFILL = "prefill"  # compute-bound: reads the prompt, hands the KV cache on
    DECODE = "decode"  # bandwidth-bound: generates tokens
    BOTH = "both"


class ServingEngine(StrEnum):
    """The serving engine a pod runs (``serving-engine``): selects that engine's calibrated error
    where the corpus has enough of its points (docs/stage-policy.md, "Target decision")."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    TGI = "tgi"
    LMDEPLOY = "lmdeploy"
    NIM = "nim"


_ENGINE_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")


def parse_serving_engine(raw: str) -> str:
    """``vllm`` or ``vllm/0.11.0``: a known engine, optionally with a version; kept lower-case."""
    name, slash, version = raw.strip().partition("/")
    words = ", ".join(e.value for e in ServingEngine)
    if name.lower() not in {e.value for e in ServingEngine}:
        raise ValueError(f'serving-engine "{quote(raw)}" is not one of {words} (optionally /<version>)')
    if slash and not _ENGINE_VERSION.fullmatch(version):
        raise ValueError(f'serving-engine "{quote(raw)}": the version after / must be letters, digits '
                         "and . + _ - (at most 64)")
    return name.lower() + (f"/{version}" if slash else "")


class LatencyClass(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class GangRef(BaseModel):
    """Which gang a pod belongs to and how many members make it whole."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    name: str
    size: int | None  # None: the size comes from a PodGroup object the adapter must look up
    source: str  # which convention named it, for explain output

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def volcano(self) -> bool:
        """Named by Volcano's group-name annotation: without ``gang-size``, the size is the
        ``minMember`` of Volcano's PodGroup of that name (``scheduling.volcano.sh``)."""
        return self.source == VOLCANO_GANG_SOURCE

    @property
    def native(self) -> bool:
        """Named by the pod's ``spec.schedulingGroup``: size and policy come only from the native
        PodGroup (``scheduling.k8s.io/v1alpha2``), the object kube-scheduler's own gang cycle reads
        (docs/gangs.md, native Workload API)."""
        return self.source == NATIVE_GANG_SOURCE


class ClaimedDevices(BaseModel):
    """What a pod's DRA claims, and the extended resources a DeviceClass backs, say beyond its GPU
    count (docs/dra.md): read by ``app.dra.demand``, carried by every ``WorkloadSpec``."""

    model_config = ConfigDict(frozen=True)

    # From DRA claims (docs/dra.md): the productName predicates and minimum memory of recognised
    # selectors on full GPUs, MIG slices asked for (count, profiles, minimum memory), and the
    # selectors left to kube-scheduler, for explain.
    gpu_products: tuple[tuple[str, tuple[str, ...]], ...] = ()
    gpu_min_memory_gb: float = 0.0
    mig_slices: int = 0
    mig_profiles: tuple[str, ...] = ()  # empty: any profile
    mig_min_memory_gb: float = 0.0
    claim_notes: tuple[str, ...] = ()
    # The pod's DRA claims as (ns/name, full GPUs), and how many of the pod's GPUs claims already
    # allocated hold: those devices count on their node once, whoever shares the claim, so the pod
    # neither needs them free nor is charged for them (docs/dra.md).
    claim_gpus: tuple[tuple[str, int], ...] = ()
    held_gpus: int = 0
    # Of the pod's GPUs, shares of a device that allows several allocations (consumable capacity): a GPU
    # to run on but not a whole GPU taken; kube-scheduler checks the device has room for the share.
    shared_gpus: int = 0


class WorkloadSpec(ClaimedDevices):
    """One pod's placement-relevant facts. Defaults are what an un-annotated pod means."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    name: str
    uid: str = ""
    stage: Stage | None = None
    model_params: float | None = None
    # A model-registry name (docs/annotations.md, ``model``): architecture facts for the estimates.
    model: str | None = None
    precision: Precision = Precision.BF16
    precision_fallback: tuple[Precision, ...] = ()
    context_tokens: int | None = None
    concurrency: int | None = None
    kv_cache_gb: float | None = None
    latency_class: LatencyClass | None = None
    max_ms_per_token: float | None = None
    finetune_method: FinetuneMethod | None = None
    trainable_params: float | None = None
    active_params: float | None = None  # mixture of experts: parameters read per token
    serving_role: ServingRole = ServingRole.BOTH
    serving_engine: str | None = None  # "vllm" or "vllm/0.11.0" (parse_serving_engine)
    prompt_tokens: int | None = None
    max_ttft_ms: float | None = None
    # Disaggregated serving: prefill and decode pods of one group (in one namespace) are kept close,
    # since the KV cache of every request crosses between them (docs/data-gravity.md).
    serving_group: str | None = None
    gpu_preference: tuple[str, ...] = ()
    topology_required: str | None = None
    topology_preferred: str | None = None
    depends_on: tuple[str, ...] = ()
    input_data_gb: float = 0.0
    colocation_required: str | None = None
    gang: GangRef | None = None
    gpus: int = 0
    # The pod has ResourceClaims: kube-scheduler reserves them for it in Reserve and releases them in
    # Unreserve, so only a bind call kube-scheduler is still waiting on may bind it.
    has_claims: bool = False
    cpu_millis: float = 0.0
    memory_bytes: float = 0.0
    node_name: str = ""
    scheduler_name: str = ""
    priority: int = 0
    # A scheduling gate other than GANG_GATE: kube-scheduler will not schedule the pod until
    # someone else lifts it, so a gang does not count it as arrived (docs/gangs.md).
    gated: bool = False
    # GANG_GATE: a member that exists and counts, held out of kube-scheduler's queue until its
    # gang is complete, when the extender lifts the gate (docs/gangs.md, "Held at admission").
    held: bool = False
    # The pod's spec.nodeSelector, sorted. kube-scheduler applies it to the pod it filters; a gang
    # plan needs it for the other members, which may each be pinned elsewhere (Kueue's topology-
    # aware scheduling pins every member to its own node, docs/gangs.md).
    node_selector: tuple[tuple[str, str], ...] = ()
    # spec.tolerations and the required node affinity: checked again at bind, where a bind that did
    # not come through kube-scheduler's filters is refused (app/base/bind_checks.py).
    tolerations: tuple[Toleration, ...] = ()
    required_terms: tuple[Term, ...] | None = None
    # metadata.creationTimestamp (Unix seconds, 0 when absent or unreadable): a gang's place in the
    # gang queue is its priority, then its first member's creation (docs/gangs.md, "Gang queue").
    created: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def gpus_needed_free(self) -> int:
        """GPUs that must be free on the node: ``gpus`` less those allocated claims already hold
        and the shares of devices (which need room on a device, not a whole free GPU)."""
        return max(0, self.gpus - self.held_gpus - self.shared_gpus)

    @property
    def charged_gpus(self) -> int:
        """GPUs counted as the pod's on its node: not shares (their device counts once, when
        allocated); claims are charged only until allocated (ClusterSnapshot.place)."""
        return max(0, self.gpus - self.shared_gpus)

    @property
    def effective_latency_class(self) -> LatencyClass | None:
        if self.latency_class is not None:
            return self.latency_class
        return LatencyClass.INTERACTIVE if self.stage is Stage.SERVING else None

    @property
    def effective_finetune_method(self) -> FinetuneMethod:
        """``full`` unless the pod says otherwise; trainable-params alone means adapters (LoRA)."""
        if self.finetune_method is not None:
            return self.finetune_method
        return FinetuneMethod.LORA if self.trainable_params is not None else FinetuneMethod.FULL

    @property
    def precisions(self) -> tuple[Precision, ...]:
        """The declared precision first, then fallbacks in the order the user gave."""
        return (self.precision, *(p for p in self.precision_fallback if p != self.precision))


# "8B" on a pod and 8.03B in the registry are the same model; 70B against a 72B registry entry is not.
MODEL_PARAMS_TOLERANCE = 0.05


def _resolve_model(raw: str, fields: dict[str, Any], problems: list[str]) -> None:
    """``model``: a registry entry; it supplies model-params and active-params a pod leaves out,
    and must agree with the ones it gives (a mismatch is a typo in one of them)."""
    from app.base.model_registry import default_registry

    registry = default_registry()
    arch = registry.get(raw) if len(raw) <= MAX_NAME_CHARS else None
    if arch is None:
        near = registry.nearest(raw[:MAX_NAME_CHARS])
        problems.append(AnnotationProblem(
            "model", f'model "{quote(raw)}" is not in the model registry'
            + (f" (nearest: {near})" if near else "") + "; give model-params instead"))
        return
    fields["model"] = arch.name
    for key, known in (("model_params", arch.params), ("active_params", arch.active_params)):
        given = fields.get(key)
        if known is None:
            continue
        if given is None:
            fields[key] = known
        elif not math.isclose(given, known, rel_tol=MODEL_PARAMS_TOLERANCE):
            name = key.replace("_", "-")
            problems.append(AnnotationProblem(
                name, f"{name} {given / 1e9:g}B disagrees with model {arch.name} ({known / 1e9:g}B)"))


def _model_by_counts(fields: dict[str, Any]) -> None:
    """A mixture of experts written as counts that match one registry entry is that model: the
    estimates then use its layers, experts and routing, so the pod gets the same answer as when it
    names the model (docs/annotations.md, ``model``)."""
    from app.base.model_registry import default_registry

    total, active = fields.get("model_params"), fields.get("active_params")
    if total is None or active is None:
        return
    arch = default_registry().by_counts(total, active, MODEL_PARAMS_TOLERANCE)
    if arch is not None:
        fields["model"] = arch.name


class WorkloadError(ValueError):
    """The pod's annotations cannot be understood. ``problems`` are event-ready sentences."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class ClaimReader(Protocol):
    """What a pod's DRA claims hold or ask for (app.dra.index.DraIndex, once the cluster adapter has
    read the resource.k8s.io API; docs/dra.md). Without one, extended resources only are counted."""

    def pod_gpus(self, pod: dict[str, Any], counted: tuple[str, ...] = ()) -> int:
        """Full GPUs held or asked for through claims, and through extended resources a DeviceClass
        backs other than ``counted``."""
        ...

    def pod_devices(self, pod: dict[str, Any], counted: tuple[str, ...] = ()) -> ClaimedDevices:
        """The rest of what the claims say (MIG slices, selector restrictions, the claims and how
        many GPUs of them are held)."""
        ...


def pod_resources(pod: dict[str, Any], gpu_resources: tuple[str, ...], claims: ClaimReader | None = None
                  ) -> tuple[int, float, float]:
    """Effective (gpus, cpu millis, memory bytes): max(sum of containers, largest init container),
    plus the GPUs of the pod's claims when ``claims`` reads them."""
    spec = _mapping(pod.get("spec"), "spec")

    def one(container: dict[str, Any]) -> tuple[float, float, float]:
        container = _mapping(container, "a container")
        res = _mapping(container.get("resources"), "container resources")
        req = _mapping(res.get("requests"), "resources.requests")
        lim = _mapping(res.get("limits"), "resources.limits")
        gpus = 0.0
        for key in gpu_resources:
            # Extended resources: a limit alone implies an equal request.
            val = req.get(key, lim.get(key))
            if val is not None:
                gpus += parse_quantity(val)
        cpu = req.get("cpu", lim.get("cpu"))
        mem = req.get("memory", lim.get("memory"))
        return (
            gpus,
            parse_quantity(cpu) * 1000 if cpu is not None else 0.0,
            parse_quantity(mem) if mem is not None else 0.0,
        )

    totals = [0.0, 0.0, 0.0]
    for c in _sequence(spec.get("containers"), "spec.containers"):
        for i, v in enumerate(one(c)):
            totals[i] += v
    for c in _sequence(spec.get("initContainers"), "spec.initContainers"):
        for i, v in enumerate(one(c)):
            totals[i] = max(totals[i], v)
    if claims is not None:
        totals[0] += claims.pod_gpus(pod, gpu_resources)
    if not totals[0] <= MAX_GPUS:
        raise ValueError(f"pod requests {totals[0]:g} GPUs, more than any node has")
    return round(totals[0]), totals[1], totals[2]


MAX_GPUS = 1e6


def _mapping(value: Any, what: str) -> dict[str, Any]:
    """``value`` as a JSON object (absent: empty); any other type is a problem, never a crash."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} is a {type(value).__name__}, not an object")
    return value


def _sequence(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{what} is a {type(value).__name__}, not a list")
    return value


def _strings(value: Any, what: str, problems: list[str]) -> dict[str, str]:
    """Labels or annotations: Kubernetes allows string values only; anything else is a problem."""
    try:
        raw = _mapping(value, what)
    except ValueError as exc:
        problems.append(AnnotationProblem("pod", str(exc)))
        return {}
    out: dict[str, str] = {}
    for k, v in raw.items():
        if isinstance(v, str):
            out[str(k)] = v
        elif str(k).startswith(PREFIX) or what == "labels":
            problems.append(AnnotationProblem(
                "pod", f"{what} {quote(k)} is a {type(v).__name__}, not a string"))
    return out


def unknown_keys(annotations: Any) -> list[tuple[str, str | None]]:
    """Keys under our prefix the parser does not read, each with the nearest known key (or None).

    A typo such as ``model-param`` would otherwise be ignored silently (docs/annotations.md).
    """
    if not isinstance(annotations, dict):
        return []
    known = (*ANNOTATION_KEYS, *WRITTEN_KEYS)
    out: list[tuple[str, str | None]] = []
    for key in annotations:
        if not isinstance(key, str) or not key.startswith(PREFIX):
            continue
        short = key[len(PREFIX):]
        if short in known:
            continue
        near = difflib.get_close_matches(short[:MAX_NAME_CHARS], known, n=1, cutoff=0.6)
        out.append((quote(short), near[0] if near else None))
        if len(out) >= 8:
            break
    return out


def native_group_name(spec: Any) -> str | None:
    """The PodGroup a pod's ``spec.schedulingGroup.podGroupName`` names (Kubernetes 1.36,
    ``GenericWorkload``), or None when the pod has no readable one."""
    group = spec.get("schedulingGroup") if isinstance(spec, dict) else None
    name = group.get("podGroupName") if isinstance(group, dict) else None
    return name if isinstance(name, str) and name else None


def gang_of(
    namespace: str, labels: dict[str, str], annotations: dict[str, str], problems: list[str],
    pod_spec: dict[str, Any] | None = None,
) -> GangRef | None:
    """Gang identity from the conventions users already use, in docs/annotations.md order."""

    def size(key: str, raw: str | None) -> int | None:
        if raw is None:
            return None
        try:
            return parse_positive_int(key, raw)
        except ValueError as exc:
            problems.append(AnnotationProblem("gang-size", str(exc)))
            return None

    if name := native_group_name(pod_spec):
        # First: kube-scheduler gangs these pods by the same reference, with the PodGroup's
        # minCount; a gang-size annotation is not read, so both count the same members.
        return GangRef(namespace=namespace, name=name, size=None, source=NATIVE_GANG_SOURCE)
    own_size = annotations.get(PREFIX + "gang-size")
    if name := labels.get("scheduling.x-k8s.io/pod-group"):
        return GangRef(namespace=namespace, name=name, size=size("gang-size", own_size),
                       source="scheduling.x-k8s.io/pod-group")
    if name := (annotations.get(VOLCANO_GANG_SOURCE) or annotations.get("scheduling.volcano.sh/group-name")):
        # Volcano's two names for a pod's PodGroup (volcano.sh/apis, scheduling/v1beta1 labels.go).
        return GangRef(namespace=namespace, name=name, size=size("gang-size", own_size),
                       source=VOLCANO_GANG_SOURCE)
    if name := labels.get("kueue.x-k8s.io/pod-group-name"):
        raw = annotations.get("kueue.x-k8s.io/pod-group-total-count", own_size)
        return GangRef(namespace=namespace, name=name, size=size("pod-group-total-count", raw),
                       source="kueue.x-k8s.io/pod-group-name")
    if name := labels.get("leaderworkerset.sigs.k8s.io/group-key"):
        raw = annotations.get("leaderworkerset.sigs.k8s.io/size", own_size)
        return GangRef(namespace=namespace, name=name, size=size("leaderworkerset size", raw),
                       source="leaderworkerset.sigs.k8s.io/group-key")
    if name := annotations.get(PREFIX + "gang-name"):
        s = size("gang-size", own_size)
        if own_size is None:
            problems.append(AnnotationProblem("gang-size", "gang-name is set but gang-size is missing"))
        return GangRef(namespace=namespace, name=name, size=s, source=PREFIX + "gang-name")
    return None


def _split(text: str, key: str = "list") -> tuple[str, ...]:
    """A comma list, bounded: at most MAX_LIST_ITEMS entries of at most MAX_NAME_CHARS each."""
    if text.count(",") >= MAX_LIST_ITEMS * 4:  # refuse before splitting a huge value
        raise ValueError(f"{key} has more than {MAX_LIST_ITEMS} entries")
    items = tuple(p.strip() for p in text.split(",") if p.strip())
    if len(items) > MAX_LIST_ITEMS:
        raise ValueError(f"{key} has {len(items)} entries, more than {MAX_LIST_ITEMS}")
    long = next((p for p in items if len(p) > MAX_NAME_CHARS), None)
    if long is not None:
        raise ValueError(f'{key} entry "{quote(long)}" is longer than {MAX_NAME_CHARS} characters')
    return items


def _choice(key: str, values: Mapping[str, Any], words: str) -> Callable[[str], Any]:
    """A parser for one of a fixed set of words (case-insensitive), naming them when it fails."""
    def parse(raw: str) -> Any:
        got = values.get(raw.lower())
        if got is None:
            raise ValueError(f'{key} "{quote(raw)}" is not {words}')
        return got
    return parse


def _name(key: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if len(raw) > MAX_NAME_CHARS:
            raise ValueError(f'{key} "{quote(raw)}" is longer than {MAX_NAME_CHARS} characters')
        return raw
    return parse


@dataclass(frozen=True, slots=True)
class Annotation:
    """One ``llm-placement.io/<key>`` annotation: the WorkloadSpec field it sets and how it is read."""

    key: str
    field: str
    parse: Callable[[str], Any]


_PRECISIONS = _choice("precision", {p.value: p for p in Precision},
                      "one of fp32, bf16, fp16, fp8, int8, int4")
# The annotations read one value each, in the order their problems are reported (docs/annotations.md).
# The gang keys (gang_of) and ``model`` (the registry) are read apart: they combine several sources.
ANNOTATIONS: tuple[Annotation, ...] = (
    Annotation("stage", "stage", _choice(
        "stage", STAGE_ALIASES, "one of data-prep, pretraining, alignment, deployment, serving")),
    Annotation("model-params", "model_params", parse_param_count),
    Annotation("precision", "precision", _PRECISIONS),
    Annotation("precision-fallback", "precision_fallback",
               lambda raw: tuple(_PRECISIONS(p) for p in _split(raw, "precision-fallback"))),
    Annotation("context-tokens", "context_tokens", lambda raw: parse_positive_int("context-tokens", raw)),
    Annotation("concurrency", "concurrency", lambda raw: parse_positive_int("concurrency", raw)),
    Annotation("kv-cache-gb", "kv_cache_gb",
               lambda raw: parse_positive_number("kv-cache-gb", raw, allow_zero=True)),
    Annotation("max-ms-per-token", "max_ms_per_token",
               lambda raw: parse_positive_number("max-ms-per-token", raw)),
    Annotation("input-data-gb", "input_data_gb",
               lambda raw: parse_positive_number("input-data-gb", raw, allow_zero=True)),
    Annotation("latency-class", "latency_class", _choice(
        "latency-class", {c.value: c for c in LatencyClass}, "interactive or batch")),
    Annotation("finetune-method", "finetune_method", _choice(
        "finetune-method", {m.value: m for m in FinetuneMethod}, "full, lora or qlora")),
    Annotation("serving-role", "serving_role", _choice(
        "serving-role", {r.value: r for r in ServingRole}, "prefill, decode or both")),
    Annotation("serving-engine", "serving_engine", parse_serving_engine),
    Annotation("prompt-tokens", "prompt_tokens", lambda raw: parse_positive_int("prompt-tokens", raw)),
    Annotation("max-ttft-ms", "max_ttft_ms", lambda raw: parse_positive_number("max-ttft-ms", raw)),
    Annotation("trainable-params", "trainable_params",
               lambda raw: parse_param_count(raw, "trainable-params")),
    Annotation("active-params", "active_params", lambda raw: parse_param_count(raw, "active-params")),
    Annotation("gpu-preference", "gpu_preference", lambda raw: _split(raw, "gpu-preference")),
    Annotation("depends-on", "depends_on", lambda raw: _split(raw, "depends-on")),
    Annotation("topology-required-placement", "topology_required", _name("topology-required-placement")),
    Annotation("topology-preferred-placement", "topology_preferred", _name("topology-preferred-placement")),
    Annotation("colocation", "colocation_required", _name("colocation")),
    Annotation("serving-group", "serving_group", _name("serving-group")),
)


# Every pod annotation key parse_workload reads (after PREFIX): the user-facing contract, the table
# above plus the gang keys (gang_of) and ``model``. docs/annotations.md documents each one;
# tests/unit/base/test_contract_docs.py keeps the docs, the README and this tuple in step with the parser.
ANNOTATION_KEYS: tuple[str, ...] = (*(a.key for a in ANNOTATIONS), "gang-name", "gang-size", "model")


def parse_workload(
    pod: dict[str, Any], gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu"),
    claims: ClaimReader | None = None,
) -> WorkloadSpec:
    """Parse a pod dict into a WorkloadSpec; raise WorkloadError listing every problem. ``claims``:
    how the pod's DRA claims are read (None: the cluster has no DRA, or it is not read yet)."""
    if not isinstance(pod, dict):
        raise WorkloadError([AnnotationProblem("pod", "pod is not a JSON object")])
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise WorkloadError([AnnotationProblem("pod", "pod metadata/spec are not JSON objects")])
    problems: list[str] = []
    ann = _strings(meta.get("annotations"), "annotations", problems)
    labels = _strings(meta.get("labels"), "labels", problems)
    fields = _object_fields(meta, spec, problems)
    values = {k[len(PREFIX):]: v.strip() for k, v in ann.items()
              if k.startswith(PREFIX) and v.strip() != ""}
    _annotation_fields(values, fields, problems)
    gang = gang_of(fields["namespace"], labels, ann, problems, spec)
    if gang is not None and len(gang.name) > MAX_NAME_CHARS:
        problems.append(AnnotationProblem(
            "gang-name", f'gang name "{quote(gang.name)}" is longer than {MAX_NAME_CHARS} characters'))
        gang = None
    fields["gang"] = gang
    _resource_fields(pod, spec, gpu_resources, claims, fields, problems)
    get = values.get
    if (raw := get("model")) is not None:
        _resolve_model(raw, fields, problems)
    else:
        _model_by_counts(fields)
    _cross_check(fields, problems)
    if problems:
        raise WorkloadError(problems)
    return WorkloadSpec(**fields)


def created_at(meta: Any) -> float:
    """``metadata.creationTimestamp`` as Unix seconds; 0 when absent or not an RFC 3339 time (an
    object without it sorts first among equals, which only a hand-made object can be)."""
    raw = meta.get("creationTimestamp") if isinstance(meta, dict) else None
    if not isinstance(raw, str) or not raw:
        return 0.0
    try:
        return datetime.fromisoformat(raw).timestamp()
    except ValueError:
        return 0.0


def _object_fields(meta: dict[str, Any], spec: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """What the pod object itself says: identity, node, scheduler, priority, gates."""

    def text(obj: dict[str, Any], key: str, default: str = "") -> str:
        v = obj.get(key)
        if v is None or v == "":
            return default
        if not isinstance(v, str):
            problems.append(AnnotationProblem("pod", f"{key} is a {type(v).__name__}, not a string"))
            return default
        return v

    fields: dict[str, Any] = {
        "namespace": text(meta, "namespace", "default"),
        "name": text(meta, "name"),
        "uid": text(meta, "uid"),
        "node_name": text(spec, "nodeName"),
        "scheduler_name": text(spec, "schedulerName"),
    }
    fields["created"] = created_at(meta)
    prio = spec.get("priority")
    # Kubernetes priorities are int32; anything else (a float, 1e30, a string) counts as 0.
    fields["priority"] = prio if isinstance(prio, int) and not isinstance(prio, bool) \
        and abs(prio) <= 2**31 else 0
    gates = spec.get("schedulingGates")
    names = [g.get("name") if isinstance(g, dict) else g for g in gates] if isinstance(gates, list) else []
    fields["gated"] = bool(gates) and (not isinstance(gates, list) or any(n != GANG_GATE for n in names))
    fields["held"] = GANG_GATE in names
    selector = spec.get("nodeSelector")
    if isinstance(selector, dict):
        # The API server only admits string keys and values; anything else cannot match a node.
        fields["node_selector"] = tuple(sorted((str(k), v) for k, v in selector.items()
                                               if isinstance(v, str)))
    if (tolerations := tolerations_of(spec)):
        fields["tolerations"] = tolerations
    if (terms := required_terms_of(spec)) is not None:
        fields["required_terms"] = terms
    return fields


def _annotation_fields(values: Mapping[str, str], fields: dict[str, Any], problems: list[str]) -> None:
    """Each annotation of the table through its parser (``values``: key without prefix, stripped)."""
    for a in ANNOTATIONS:
        if (raw := values.get(a.key)) is not None:
            try:
                fields[a.field] = a.parse(raw)
            except ValueError as exc:
                problems.append(AnnotationProblem(a.key, str(exc)))
    if (level := fields.get("colocation_required")) is not None:
        if level == "required":
            fields["colocation_required"] = "node"
        elif level not in ("node", "nvlink", "leaf", "fabric", "zone", "preferred"):
            problems.append(AnnotationProblem(
                "colocation",
                f'colocation "{quote(level)}" is not required, node, nvlink, leaf, fabric or zone'))
        if fields.get("colocation_required") == "preferred":
            fields["colocation_required"] = None


def _resource_fields(pod: dict[str, Any], spec: dict[str, Any], gpu_resources: tuple[str, ...],
                     claims: ClaimReader | None, fields: dict[str, Any], problems: list[str]) -> None:
    try:
        resources = pod_resources(pod, gpu_resources, claims)
        fields["gpus"], fields["cpu_millis"], fields["memory_bytes"] = resources
    except ValueError as exc:
        problems.append(AnnotationProblem("resources", str(exc)))
    if spec.get("resourceClaims"):
        fields["has_claims"] = True
    # Claims, the claim kube-scheduler makes for extended resources a DeviceClass backs (named in
    # the status), and those extended resources themselves: any pod may have them.
    if claims is not None:
        fields.update(claims.pod_devices(pod, gpu_resources).model_dump(exclude_defaults=True))


def _cross_check(fields: dict[str, Any], problems: list[str]) -> None:
    """Annotations that are valid alone but contradict each other."""
    if fields.get("stage") is Stage.SERVING and "model_params" not in fields and "kv_cache_gb" in fields:
        problems.append(AnnotationProblem("kv-cache-gb", "kv-cache-gb is set but model-params is missing"))
    total = fields.get("model_params")
    for key in ("trainable-params", "active-params"):
        part = fields.get(key.replace("-", "_"))
        if part is None:
            continue
        if total is None:
            problems.append(AnnotationProblem(key, f"{key} is set but model-params is missing"))
        elif part > total:
            problems.append(AnnotationProblem(key, f"{key} is larger than model-params"))
    prompt, context = fields.get("prompt_tokens"), fields.get("context_tokens")
    if prompt is not None and context is not None and prompt > context:
        # The context is the prompt and the output together: such a request cannot be served, and
        # its KV cache would be estimated at the smaller figure (docs/annotations.md).
        problems.append(AnnotationProblem(
            "prompt-tokens", f"prompt-tokens {prompt} is larger than context-tokens {context} (the "
                             "context holds the prompt and the output)"))
    stage_set = fields.get("stage")
    if "serving_group" in fields and stage_set is not None and stage_set is not Stage.SERVING:
        problems.append(AnnotationProblem(
            "serving-group", f"serving-group applies to stage serving, not {stage_set.value}"))
    if fields.get("finetune_method") is FinetuneMethod.FULL and "trainable_params" in fields:
        problems.append(AnnotationProblem(
            "trainable-params", "trainable-params applies to finetune-method lora or qlora, not full"))
