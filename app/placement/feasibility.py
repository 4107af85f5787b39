"""Hard rules (filter): may this pod run on this node at all, and if so at which precision?

Every rejection carries a short, node-independent reason so kube-scheduler's "0/N nodes are
available" line aggregates it into counts, and a flag saying whether preemption could ever help.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from app.base.reasons import ReasonCode, Rejection, reject
from app.base.workload import (
    CPU_STAGES,
    TRAINING_STAGES,
    LatencyClass,
    Precision,
    ServingRole,
    Stage,
    WorkloadSpec,
)
from app.config.policy import FeasibilityPolicy
from app.dra.index import product_matches
from app.serving.model import (
    Estimate,
    TargetQuantile,
    error_group,
    serving_estimate,
    serving_lengths,
    target_quantile,
    tp_link,
)
from app.serving.profiles import Profile
from app.serving.sizing import Sizing, TensorParallel, decode_ms_per_token, size
from app.snapshot.nodes import CPU_MEMORY_BANDWIDTH_TBS, NodeFacts
from app.snapshot.store import NodeUsage

K = TypeVar("K")  # node names, or the placer's node classes

__all__ = ["NodeFit", "Rejection", "apply_default_target", "evaluate", "pod_hourly_cost"]


@dataclass(slots=True)  # not frozen: thousands are made per request and frozen init is slow
class NodeFit:
    """A feasible node and what the pod would get there."""

    node: NodeFacts
    sizing: Sizing
    ms_per_token: float | None
    pod_hourly_cost: float
    fallback_used: bool
    ttft_ms: float | None = None  # predicted time to first token (prefill), when a target asks
    # Tensor-parallel all-reduce cost, already inside ms_per_token and ttft_ms (multi-GPU serving).
    tp: TensorParallel | None = None
    # The measured profile that replaced the estimates, if one matched (docs/stage-policy.md,
    # "Measured profiles"), and what the estimates would have said, for calibration.
    profile: Profile | None = None
    estimated_ms_per_token: float | None = None
    estimated_ttft_ms: float | None = None
    # The serving model's figures with their parts (GPU serving pods), for explain.
    estimate: Estimate | None = None
    # Of the pod's clients, how many the KV cache holds at once there (the rest queue).
    clients_held: int | None = None

    def on(self, node: NodeFacts) -> NodeFit:
        """The same verdict for another node of identical shape."""
        return NodeFit(node, self.sizing, self.ms_per_token, self.pod_hourly_cost, self.fallback_used,
                       self.ttft_ms, self.tp, self.profile, self.estimated_ms_per_token,
                       self.estimated_ttft_ms, self.estimate, self.clients_held)

    @property
    def ms_source(self) -> str:
        measured = self.profile is not None and self.profile.ms_per_token is not None
        return "measured" if measured else "estimated"

    @property
    def ttft_source(self) -> str:
        measured = self.profile is not None and self.profile.ttft_ms is not None
        return "measured" if measured else "estimated"


PARTITIONED = reject(ReasonCode.NO_GPUS, "node's GPUs are all partitioned into MIG slices")
SELECTOR_PRODUCT = reject(ReasonCode.DEVICE_SELECTOR,
                          "GPU model not accepted by the claim's productName selector")
SELECTOR_MEMORY = reject(ReasonCode.DEVICE_SELECTOR, "GPU memory below the claim's memory selector")
NO_MIG = reject(ReasonCode.NO_GPUS, "node has no MIG slices")
MIG_PROFILE = reject(ReasonCode.DEVICE_SELECTOR, "no MIG slice of the claimed profile or memory")
MIG_BUSY = reject(ReasonCode.GPUS_BUSY, "not enough free MIG slices of the claimed profile",
                  unresolvable=False)


# A free-GPU count this large means "capacity not checked" (the binder describes a placement whose
# own devices are already counted); MIG slices then ignore their free counts the same way.
UNCHECKED = 1 << 30


def _evaluate_mig(
    spec: WorkloadSpec, node: NodeFacts, usage: NodeUsage, free_gpus: int, policy: FeasibilityPolicy
) -> NodeFit | Rejection:
    """A pod whose claims ask for MIG slices (docs/dra.md, "MIG").

    The slices of the claimed profiles (any profile when none is named) with enough memory for the
    claim's memory selector are candidates; enough of them must be free. kube-scheduler picks which
    of them the pod gets, so the rules are checked against the smallest free candidate, as one GPU
    with that memory and the bandwidth share of its memory slices (MIG partitions memory bandwidth
    with memory; a CUDA process sees one MIG device, so a model must fit in one slice).
    """
    if not node.mig:
        return NO_MIG
    cands = [m for m in node.mig if (not spec.mig_profiles or m[0] in spec.mig_profiles)
             and m[1] + 1e-9 >= spec.mig_min_memory_gb]
    if not cands:
        return MIG_PROFILE
    unchecked = free_gpus >= UNCHECKED
    if not unchecked and sum(m[2] for m in cands) < spec.mig_slices:
        # More slices than the node has of that profile, free or not: preemption cannot help.
        return reject(ReasonCode.GPU_CAPACITY, f"pod needs {spec.mig_slices} MIG slices of the claimed "
                      "profile, more than the node has")
    if not unchecked and sum(m[3] for m in cands) < spec.mig_slices:
        return MIG_BUSY
    mem = min(m[1] for m in cands if m[3] > 0 or unchecked)
    full = node.gpu.memory_gb if node.gpu is not None else 0.0
    share = min(1.0, mem / full) if full > 0 else 1.0
    physical = node.gpu_count + node.mig_gpus
    slice_cost = node.hourly_cost / physical * share if physical else node.hourly_cost
    view = node.model_copy(update={
        "gpu_count": 1, "gpu_memory_gb": mem, "gpu_bandwidth_tbs": node.gpu_bandwidth_tbs * share,
        "hourly_cost": slice_cost * spec.mig_slices, "mig": ()})
    one = spec.model_copy(update={"gpus": 1, "mig_slices": 0})
    got = evaluate(one, view, usage, 1, policy)
    if isinstance(got, Rejection):
        if got.code is ReasonCode.GPU_MEMORY:
            return Rejection(got.code, got.message.replace("per GPU on 1 GPU", "per MIG slice")
                             .replace("GPU memory too small", "MIG slice memory too small"), got.unresolvable)
        return got
    return got.on(node)


def _fmt_params(p: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if p >= scale:
            return f"{p / scale:g}{suffix}"
    return f"{p:g}"


def pod_hourly_cost(spec: WorkloadSpec, node: NodeFacts) -> float:
    """The share of the node's price this pod occupies (what it costs to run it here)."""
    if spec.gpus > 0 and node.gpu_count > 0:
        return node.hourly_cost * spec.gpus / node.gpu_count
    shares = [0.0]
    if node.cpu_millis > 0:
        shares.append(spec.cpu_millis / node.cpu_millis)
    if node.memory_bytes > 0:
        shares.append(spec.memory_bytes / node.memory_bytes)
    # Even a tiny pod blocks a slice of an expensive node; charge at least 1% of it.
    return node.hourly_cost * max(0.01, *shares)


def evaluate(
    spec: WorkloadSpec, node: NodeFacts, usage: NodeUsage, free_gpus: int,
    policy: FeasibilityPolicy,
) -> NodeFit | Rejection:
    """Apply the stage's hard rules; return the best feasible precision or a Rejection."""
    if spec.mig_slices > 0 and spec.gpus == 0:
        return _evaluate_mig(spec, node, usage, free_gpus, policy)
    problem = _node_rules(spec, node, usage, free_gpus, policy)
    if problem is not None:
        return problem
    first_problem: Rejection | None = None
    for i, precision in enumerate(spec.precisions):
        got = _at_precision(spec, node, usage, precision, policy, fallback=i > 0)
        if isinstance(got, NodeFit):
            return got
        first_problem = first_problem or got
    assert first_problem is not None
    return first_problem


def _node_rules(spec: WorkloadSpec, node: NodeFacts, usage: NodeUsage, free_gpus: int,
                policy: FeasibilityPolicy) -> Rejection | None:
    """The rules that do not depend on the precision: GPUs, their selectors and count, the stage."""
    if spec.gpus > 0 and not node.has_gpus:
        if node.mig:
            return PARTITIONED
        return reject(ReasonCode.NO_GPUS, "node has no GPUs")
    cpu_stage = spec.stage in CPU_STAGES and not policy.cpu_stages_may_use_gpu_nodes
    if cpu_stage and spec.gpus == 0 and spec.mig_slices == 0 and node.gpu_node:
        assert spec.stage is not None
        return reject(ReasonCode.CPU_STAGE_ON_GPU,
                      f"{spec.stage.value} pods without GPU requests stay off GPU nodes")
    if spec.gpus > 0 and (spec.gpu_products or spec.gpu_min_memory_gb):
        # Recognised selectors of the pod's claims (docs/dra.md): kube-scheduler applies them per
        # pod too, but a gang plan is made for every member at once and must not pick nodes
        # DynamicResources would then refuse.
        if not product_matches(spec.gpu_products, node.gpu_product):
            return SELECTOR_PRODUCT
        if spec.gpu_min_memory_gb and node.gpu_memory_gb + 1e-9 < spec.gpu_min_memory_gb:
            return SELECTOR_MEMORY
    if spec.gpus > node.gpu_count and free_gpus < UNCHECKED:
        # Unresolvable: evicting every pod on the node would not make room, so kube-scheduler must
        # not try preemption here (it would evict pods for nothing). No node size in the text: one
        # reason for every too-small node keeps kube-scheduler's "0/N nodes" line short.
        return reject(ReasonCode.GPU_CAPACITY, f"pod needs {spec.gpus} GPUs, more than the node has")
    # GPUs an allocated claim of the pod holds already are not needed free (docs/dra.md).
    if spec.gpus > 0 and free_gpus < spec.gpus_needed_free:
        return reject(ReasonCode.GPUS_BUSY, "not enough free GPUs (in use or reserved for a gang)",
                      unresolvable=False)
    sized_gpu = spec.gpus > 0 and spec.model_params is not None
    if sized_gpu and not node.gpu_known and node.gpu_memory_gb <= 0:
        return reject(ReasonCode.UNKNOWN_GPU,
                      "GPU product unknown to the catalog; not used for sized LLM workloads")
    lat = spec.effective_latency_class
    if spec.stage is Stage.SERVING and lat is LatencyClass.INTERACTIVE and usage.training > 0:
        return reject(ReasonCode.SEPARATION, "interactive serving is kept off nodes running training")
    return None


def _at_precision(spec: WorkloadSpec, node: NodeFacts, usage: NodeUsage, precision: Precision,
                  policy: FeasibilityPolicy, fallback: bool) -> NodeFit | Rejection:
    """Memory, FP8 support and the serving targets at one precision."""
    sizing = size(spec, precision, default_context=policy.default_context_tokens,
                  default_concurrency=policy.default_concurrency,
                  alignment_extra_headroom=policy.alignment_extra_headroom)
    problem = _memory_problem(spec, node, usage, sizing, policy)
    if (problem is None and precision is Precision.FP8 and spec.gpus > 0 and node.gpu
            and not (node.gpu.fp8 or node.gpu.fp8_weight_only)):
        problem = reject(ReasonCode.PRECISION, "fp8 needs FP8 tensor cores or weight-only "
                         "FP8 kernels (compute capability 7.5+)")
    if problem is not None:
        return problem
    at = f" at {precision.value}" if len(spec.precisions) > 1 else ""
    profile = (policy.profiles.match(spec, node.gpu, precision)
               if policy.profiles is not None and node.gpu is not None and spec.gpus > 0
               and spec.stage is Stage.SERVING else None)
    if (profile is not None and profile.max_concurrency is not None
            and (spec.concurrency or policy.default_concurrency) > profile.max_concurrency):
        return reject(ReasonCode.LATENCY_SLO,
                      f"measured: serves at most {profile.max_concurrency} sequences at once{at}")
    est: Estimate | None = None
    tp: TensorParallel | None = None
    # A GPU-served pod is estimated by the calibrated serving model (docs/stage-policy.md, "The
    # serving model"); its tensor-parallel share is kept apart so a rejection can name it.
    held: int | None = None
    if spec.stage is Stage.SERVING and spec.model_params is not None and spec.gpus > 0 and node.gpu:
        # Clients beyond what the KV cache holds queue: the others are served at the load that fits.
        held = sizing.clients_held(node.gpu_memory_gb * (1 - policy.memory_headroom), spec.gpus) or None
        est = serving_estimate(spec, precision, node.gpu, node.gpu_bandwidth_tbs, policy, held)
        if spec.gpus > 1:
            tp = TensorParallel(tp_link(node.gpu, policy.serving), spec.gpus, est.tp_per_token_ms,
                                est.tp_prefill_ms)
    clients = held or spec.concurrency or policy.default_concurrency  # the load latency is judged at
    ms: float | None = None
    estimated_ms: float | None = None
    if spec.stage is Stage.SERVING and spec.model_params is not None:
        if est is not None:
            ms = est.ms_per_token
        else:  # served from host memory: a CPU reads the weights at its memory bandwidth
            ms = decode_ms_per_token(sizing, spec.gpus, CPU_MEMORY_BANDWIDTH_TBS,
                                     policy.serving.bandwidth_efficiency["w16"])
        estimated_ms = ms
        if profile is not None and profile.ms_per_token is not None:
            ms = profile.ms_per_token  # a measurement beats the estimate, all-reduces included
        problem = _decode_target(spec, precision, ms, est, tp, profile, policy, at, clients)
    ttft: float | None = None
    first_token = (spec.max_ttft_ms is not None and spec.stage is Stage.SERVING
                   and spec.serving_role is not ServingRole.DECODE and spec.model_params is not None)
    if problem is None and first_token:
        ttft = est.ttft_ms if est is not None else None
        measured_ttft = profile.ttft_for(serving_lengths(spec, policy)[0]) if profile is not None else None
        problem = _first_token_target(spec, precision, ttft, measured_ttft, est, tp, policy, clients)
        ttft = measured_ttft if measured_ttft is not None else ttft
    if problem is not None:
        return problem
    return NodeFit(node, sizing, ms, pod_hourly_cost(spec, node), fallback_used=fallback,
                   ttft_ms=ttft, tp=tp, profile=profile, estimated_ms_per_token=estimated_ms,
                   estimated_ttft_ms=est.ttft_ms if est is not None and ttft is not None else None,
                   estimate=est, clients_held=held)


def _quantile(spec: WorkloadSpec, precision: Precision, policy: FeasibilityPolicy, metric: str,
              clients: int) -> TargetQuantile:
    return target_quantile(policy.serving, error_group(spec, precision, clients), metric,
                           policy.serving_confidence, clients, spec.serving_engine)


def _decode_target(spec: WorkloadSpec, precision: Precision, ms: float | None, est: Estimate | None,
                   tp: TensorParallel | None, profile: Profile | None, policy: FeasibilityPolicy, at: str,
                   clients: int) -> Rejection | None:
    """``max-ms-per-token``: a measurement as it is; an estimate times its group's quantile of
    measured / estimate at the configured confidence (docs/stage-policy.md, "Target decision")."""
    if spec.serving_role is ServingRole.PREFILL or spec.max_ms_per_token is None:
        return None
    measured = profile is not None and profile.ms_per_token is not None
    q = None if measured or est is None else _quantile(spec, precision, policy, "tpot", clients)
    factor = 1.0 if q is None else q.factor
    if ms is not None and ms * factor <= spec.max_ms_per_token:
        return None
    # Name the cause: bandwidth alone would have met the target, the all-reduces did not.
    comm = (not measured and ms is not None and tp is not None
            and (ms - tp.per_token_ms) * factor <= spec.max_ms_per_token)
    why = ("measured too slow" if measured
           else f"tensor-parallel all-reduce over {tp.link.kind} too slow" if comm and tp
           else "memory bandwidth too low")
    shown = f" ({q.rule()})" if q is not None and ms else ""
    return reject(ReasonCode.LATENCY_SLO, f"cannot meet {spec.max_ms_per_token:g} ms/token: {why}{at}{shown}")


def _first_token_target(spec: WorkloadSpec, precision: Precision, ttft: float | None,
                        measured_ttft: float | None, est: Estimate | None, tp: TensorParallel | None,
                        policy: FeasibilityPolicy, clients: int) -> Rejection | None:
    """``max-ttft-ms``, the same way as the per-token target."""
    assert spec.max_ttft_ms is not None
    if measured_ttft is not None:
        ttft = measured_ttft
    q = (None if measured_ttft is not None or est is None
         else _quantile(spec, precision, policy, "ttft", clients))
    factor = 1.0 if q is None else q.factor
    if ttft is not None and ttft * factor <= spec.max_ttft_ms:
        return None
    comm = (measured_ttft is None and ttft is not None and tp is not None
            and (ttft - tp.prefill_ms) * factor <= spec.max_ttft_ms)
    why = ("GPU compute unknown" if ttft is None
           else "measured too slow" if measured_ttft is not None
           else f"tensor-parallel all-reduce over {tp.link.kind} too slow" if comm and tp
           else "compute too low")
    shown = f" ({q.rule()})" if q is not None and ttft is not None else ""
    return reject(ReasonCode.LATENCY_SLO, f"cannot meet {spec.max_ttft_ms:g} ms to first token: {why}{shown}")


def apply_default_target(
    spec: WorkloadSpec, fits: dict[K, NodeFit], rejections: dict[K, Rejection],
    policy: FeasibilityPolicy,
) -> None:
    """Interactive serving without max-ms-per-token: drop the feasible nodes that miss the default
    target, but only when at least one feasible node meets it (docs/stage-policy.md).

    A pod that names no target still serves people; placing it on a node predicted too slow when a
    fast enough one is free is a silent miss. When no candidate meets the target the pod is not
    refused: the slower nodes stay feasible and the bandwidth term ranks them.
    """
    if (not policy.default_target_filter or spec.stage is not Stage.SERVING
            or spec.max_ms_per_token is not None or spec.serving_role is ServingRole.PREFILL
            or spec.effective_latency_class is not LatencyClass.INTERACTIVE):
        return
    target = policy.default_interactive_ms_per_token
    slow = [n for n, f in fits.items() if f.ms_per_token is not None and f.ms_per_token > target]
    if not slow or len(slow) == len(fits):
        return
    why = reject(ReasonCode.LATENCY_SLO,
                 f"misses the default interactive target of {target:g} ms/token that other nodes "
                 "meet (set max-ms-per-token or latency-class: batch to choose otherwise)")
    for n in slow:
        del fits[n]
        rejections[n] = why


def _memory_problem(
    spec: WorkloadSpec, node: NodeFacts, usage: NodeUsage, sizing: Sizing, policy: FeasibilityPolicy
) -> Rejection | None:
    what = f"{_fmt_params(spec.model_params)} {sizing.precision.value}" if spec.model_params else ""
    if sizing.per_gpu_gb > 0:
        usable = node.gpu_memory_gb * (1 - policy.memory_headroom)
        if sizing.needed_per_gpu_gb > usable:
            n = f" on {spec.gpus} GPU" + ("s" if spec.gpus > 1 else "")
            if spec.stage in TRAINING_STAGES:
                method = spec.effective_finetune_method.value
                what += "" if method == "full" else f" {method}"
                return reject(ReasonCode.GPU_MEMORY,
                              f"{what} training needs {sizing.per_gpu_gb:.0f} GB per GPU{n}; "
                              "GPU memory too small")
            one = " (weights and one full-length sequence)" if sizing.required_per_gpu_gb is not None else ""
            return reject(ReasonCode.GPU_MEMORY, f"{what} needs {sizing.needed_per_gpu_gb:.0f} GB per "
                          f"GPU{n}{one}; GPU memory too small")
    # The pod's own memory request is checked in-tree; this catches nodes that could never hold the
    # weights, whatever the request says.
    if sizing.host_memory_gb > node.memory_bytes / 1e9:
        return reject(ReasonCode.HOST_MEMORY,
                      f"{what} needs {sizing.host_memory_gb:.0f} GB of node memory; node too small")
    return None
