"""Workload spec: what a pod declares about itself, parsed and validated from its JSON.

Input is the plain pod dict exactly as kube-scheduler (or the API server) serialises it. Every
problem is collected so one event can name all of them; nothing here raises on odd input except
``WorkloadError``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from app.core.units import (
    parse_param_count,
    parse_positive_int,
    parse_positive_number,
    parse_quantity,
)

PREFIX = "llm-placement.io/"
# Every pod annotation key parse_workload reads (after PREFIX): the user-facing contract.
# docs/annotations.md documents each one; tests/unit/test_contract_docs.py keeps the docs, the README
# and this tuple in step with the parser.
ANNOTATION_KEYS: tuple[str, ...] = (
    "stage", "model-params", "precision", "precision-fallback", "context-tokens", "concurrency",
    "kv-cache-gb", "latency-class", "max-ms-per-token", "gpu-preference",
    "topology-required-placement", "topology-preferred-placement", "depends-on", "input-data-gb",
    "colocation", "gang-name", "gang-size",
)


class Stage(StrEnum):
    DATA_PREP = "data-prep"
    PRETRAINING = "pretraining"
    ALIGNMENT = "alignment"
    DEPLOYMENT = "deployment"
    SERVING = "serving"


STAGE_ALIASES: dict[str, Stage] = {
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
}

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


class WorkloadSpec(BaseModel):
    """One pod's placement-relevant facts. Defaults are what an un-annotated pod means."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    name: str
    uid: str = ""
    stage: Stage | None = None
    model_params: float | None = None
    precision: Precision = Precision.BF16
    precision_fallback: tuple[Precision, ...] = ()
    context_tokens: int | None = None
    concurrency: int | None = None
    kv_cache_gb: float | None = None
    latency_class: LatencyClass | None = None
    max_ms_per_token: float | None = None
    gpu_preference: tuple[str, ...] = ()
    topology_required: str | None = None
    topology_preferred: str | None = None
    depends_on: tuple[str, ...] = ()
    input_data_gb: float = 0.0
    colocation_required: str | None = None
    gang: GangRef | None = None
    gpus: int = 0
    cpu_millis: float = 0.0
    memory_bytes: float = 0.0
    node_name: str = ""
    scheduler_name: str = ""
    priority: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def effective_latency_class(self) -> LatencyClass | None:
        if self.latency_class is not None:
            return self.latency_class
        return LatencyClass.INTERACTIVE if self.stage is Stage.SERVING else None

    @property
    def precisions(self) -> tuple[Precision, ...]:
        """The declared precision first, then fallbacks in the order the user gave."""
        return (self.precision, *(p for p in self.precision_fallback if p != self.precision))


class WorkloadError(ValueError):
    """The pod's annotations cannot be understood. ``problems`` are event-ready sentences."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def pod_resources(pod: dict[str, Any], gpu_resources: tuple[str, ...]) -> tuple[int, float, float]:
    """Effective (gpus, cpu millis, memory bytes): max(sum of containers, largest init container)."""
    spec = pod.get("spec") or {}

    def one(container: dict[str, Any]) -> tuple[float, float, float]:
        res = container.get("resources") or {}
        req = res.get("requests") or {}
        lim = res.get("limits") or {}
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
    for c in spec.get("containers") or []:
        for i, v in enumerate(one(c)):
            totals[i] += v
    for c in spec.get("initContainers") or []:
        for i, v in enumerate(one(c)):
            totals[i] = max(totals[i], v)
    return round(totals[0]), totals[1], totals[2]


def gang_of(
    namespace: str, labels: dict[str, str], annotations: dict[str, str], problems: list[str]
) -> GangRef | None:
    """Gang identity from the conventions users already use, in docs/annotations.md order."""

    def size(key: str, raw: str | None) -> int | None:
        if raw is None:
            return None
        try:
            return parse_positive_int(key, raw)
        except ValueError as exc:
            problems.append(str(exc))
            return None

    own_size = annotations.get(PREFIX + "gang-size")
    if name := labels.get("scheduling.x-k8s.io/pod-group"):
        return GangRef(namespace=namespace, name=name, size=size("gang-size", own_size),
                       source="scheduling.x-k8s.io/pod-group")
    if name := annotations.get("scheduling.k8s.io/group-name"):
        return GangRef(namespace=namespace, name=name, size=size("gang-size", own_size),
                       source="scheduling.k8s.io/group-name")
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
            problems.append("gang-name is set but gang-size is missing")
        return GangRef(namespace=namespace, name=name, size=s, source=PREFIX + "gang-name")
    return None


def _split(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def parse_workload(
    pod: dict[str, Any], gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu")
) -> WorkloadSpec:
    """Parse a pod dict into a WorkloadSpec; raise WorkloadError listing every problem."""
    if not isinstance(pod, dict):
        raise WorkloadError(["pod is not a JSON object"])
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise WorkloadError(["pod metadata/spec are not JSON objects"])
    ann: dict[str, str] = {k: str(v) for k, v in (meta.get("annotations") or {}).items()}
    labels: dict[str, str] = {k: str(v) for k, v in (meta.get("labels") or {}).items()}
    namespace = str(meta.get("namespace") or "default")
    problems: list[str] = []
    fields: dict[str, Any] = {
        "namespace": namespace,
        "name": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
        "node_name": str(spec.get("nodeName") or ""),
        "scheduler_name": str(spec.get("schedulerName") or ""),
    }
    try:
        fields["priority"] = int(spec.get("priority") or 0)
    except (TypeError, ValueError):
        fields["priority"] = 0

    def get(key: str) -> str | None:
        v = ann.get(PREFIX + key)
        return None if v is None or v.strip() == "" else v.strip()

    def attempt(key: str, fn: Any) -> None:
        raw = get(key)
        if raw is None:
            return
        try:
            fields[key.replace("-", "_")] = fn(raw)
        except ValueError as exc:
            problems.append(str(exc))

    if (raw := get("stage")) is not None:
        stage = STAGE_ALIASES.get(raw.lower())
        if stage is None:
            problems.append(
                f'stage "{raw}" is not one of data-prep, pretraining, alignment, deployment, serving'
            )
        fields["stage"] = stage

    attempt("model-params", parse_param_count)

    def precision(raw: str) -> Precision:
        try:
            return Precision(raw.lower())
        except ValueError:
            raise ValueError(
                f'precision "{raw}" is not one of fp32, bf16, fp16, fp8, int8, int4'
            ) from None

    attempt("precision", precision)
    attempt("precision-fallback", lambda raw: tuple(precision(p) for p in _split(raw)))
    attempt("context-tokens", lambda raw: parse_positive_int("context-tokens", raw))
    attempt("concurrency", lambda raw: parse_positive_int("concurrency", raw))
    attempt("kv-cache-gb", lambda raw: parse_positive_number("kv-cache-gb", raw, allow_zero=True))
    attempt("max-ms-per-token", lambda raw: parse_positive_number("max-ms-per-token", raw))
    attempt("input-data-gb", lambda raw: parse_positive_number("input-data-gb", raw, allow_zero=True))

    def latency(raw: str) -> LatencyClass:
        try:
            return LatencyClass(raw.lower())
        except ValueError:
            raise ValueError(f'latency-class "{raw}" is not interactive or batch') from None

    attempt("latency-class", latency)
    attempt("gpu-preference", _split)
    attempt("depends-on", _split)
    for key, field in (
        ("topology-required-placement", "topology_required"),
        ("topology-preferred-placement", "topology_preferred"),
        ("colocation", "colocation_required"),
    ):
        if (raw := get(key)) is not None:
            fields[field] = raw
    if (level := fields.get("colocation_required")) is not None:
        if level == "required":
            fields["colocation_required"] = "node"
        elif level not in ("node", "nvlink", "fabric", "zone", "preferred"):
            problems.append(f'colocation "{level}" is not required, node, nvlink, fabric or zone')
        if fields.get("colocation_required") == "preferred":
            fields["colocation_required"] = None

    fields["gang"] = gang_of(namespace, labels, ann, problems)
    try:
        fields["gpus"], fields["cpu_millis"], fields["memory_bytes"] = pod_resources(pod, gpu_resources)
    except ValueError as exc:
        problems.append(str(exc))

    if fields.get("stage") is Stage.SERVING and "model_params" not in fields and "kv_cache_gb" in fields:
        problems.append("kv-cache-gb is set but model-params is missing")
    if problems:
        raise WorkloadError(problems)
    return WorkloadSpec(**fields)
