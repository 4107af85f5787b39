"""How long a replayed training pod runs on the GPU it got, from measured training throughput.

A trace gives each pod one duration, whatever node it lands on. A training step's time is its work
(tokens) over the GPUs' measured speed, so the replay driver (``replay(..., runtime=...)``) asks this
model instead: the trace's duration is taken as the run on a reference GPU, and the pod runs
``duration x speed(reference) / speed(its GPU)`` on the GPU it got, for its model size. Speeds are
measured tokens per second per GPU (bench/data/training_throughput.yaml, with its source), interpolated
between measured model sizes on a log-log scale. A GPU without measurements is scaled from the
nearest measured one by the catalog's dense BF16 peak (a datasheet ratio, stated as such in the
results). Never the extender's own estimator: a replay must not judge placements by the model whose
quality it measures.

Batch serving (an evaluation or offline generation job) is a fixed number of tokens too: it runs
its duration times the GPU's measured per-token decode time over the reference GPU's, from pairs of
the serving corpus (app/data/measurements/) that differ only in the GPU (``ServingSpeed``).
Interactive serving runs for its lifetime whatever the node, and is judged instead: its per-token
time on the node it got is read from the corpus (``ServingJudge``), never estimated by the extender.
Data transfer time is not modelled here.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from app.base.catalog import GpuCatalog
from app.base.units import parse_tflops
from app.base.workload import (
    TRAINING_STAGES,
    LatencyClass,
    Stage,
    WorkloadError,
    WorkloadSpec,
    parse_workload,
)
from app.calibration import corpus
from app.calibration.corpus import Measurement

from .datapath import HOSTNAME_LABEL, DataPath, TierRead

DATA = Path(__file__).resolve().parents[1] / "bench" / "data" / "training_throughput.yaml"
GANG_LABEL = "scheduling.x-k8s.io/pod-group"
GANG_NAME_ANNOTATION = "llm-placement.io/gang-name"
REFERENCE_GPU = "H100-SXM-80GB"
DEFAULT_PARAMS = 7e9  # a training pod without model-params is taken as a 7B model


@dataclass(frozen=True, slots=True)
class Curve:
    """A measured figure by model size (sorted by size): tokens/s/GPU, or ms per token."""

    params: tuple[float, ...]
    values: tuple[float, ...]

    def at(self, params: float) -> float:
        """Log-log interpolation; flat beyond the measured ends (no extrapolation)."""
        xs, ys = self.params, self.values
        if params <= xs[0]:
            return ys[0]
        if params >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_left(xs, params)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        t = (math.log(params) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))


class TrainingSpeed:
    """Measured training speed per catalog GPU, and the run time of a pod on a node."""

    def __init__(self, rows: list[dict[str, Any]], catalog: GpuCatalog | None = None,
                 reference: str = REFERENCE_GPU) -> None:
        self.catalog = catalog or GpuCatalog.load()
        by_gpu: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            spec = self.catalog.lookup(str(r["gpu"]))
            if spec is None:
                raise ValueError(f"training throughput row names an unknown GPU: {r['gpu']!r}")
            by_gpu.setdefault(spec.name, []).append((float(r["params"]), float(r["tokens_per_s_per_gpu"])))
        self.curves = {g: Curve(tuple(p for p, _ in sorted(v)), tuple(t for _, t in sorted(v)))
                       for g, v in by_gpu.items()}
        if reference not in self.curves:
            raise ValueError(f"no measurements for the reference GPU {reference}")
        self.reference = reference
        self.scaled: set[str] = set()  # GPUs whose speed came from a datasheet ratio, not a row

    @classmethod
    def load(cls, path: Path = DATA) -> TrainingSpeed:
        return cls(list(yaml.safe_load(path.read_text())["rows"]))

    def speed(self, gpu: str, params: float) -> float:
        """Tokens/s/GPU of a ``params`` model on catalog GPU ``gpu``."""
        curve = self.curves.get(gpu)
        if curve is not None:
            return curve.at(params)
        spec, ref = self.catalog.lookup(gpu), self.catalog.lookup(self.reference)
        if spec is None or ref is None:
            raise ValueError(f"unknown GPU {gpu!r}")
        self.scaled.add(gpu)
        return self.curves[self.reference].at(params) * spec.bf16_tflops / ref.bf16_tflops

    def seconds(self, manifest: dict[str, Any], duration: float, gpu: str | None) -> float:
        """The pod's run time on ``gpu`` (catalog name; None: no GPU, the trace's duration)."""
        try:
            spec = parse_workload(manifest)
        except WorkloadError:
            return duration
        if gpu is None or spec.stage not in TRAINING_STAGES or spec.gpus <= 0:
            return duration
        params = spec.model_params or DEFAULT_PARAMS
        return duration * self.speed(self.reference, params) / self.speed(gpu, params)


# A batch job keeps many sequences in flight: its speed ratio comes from pairs measured at this
# concurrency or more (decode at batch 1 is bound by weight reads, batched decode less so).
BATCHED_FROM = 8


def _pair_key(m: Measurement) -> tuple[object, ...]:
    """Everything a corpus point was measured under except the GPU."""
    p = m.point
    return (m.source.id, p.engine, p.engine_version, p.model, p.precision, p.kv_precision, p.tp, p.pp,
            p.ep, p.concurrency, p.load, p.input_tokens, p.output_tokens)


def _batch_serving(spec: WorkloadSpec) -> bool:
    return (spec.stage is Stage.SERVING and spec.gpus > 0
            and spec.effective_latency_class is LatencyClass.BATCH)


class ServingSpeed:
    """Batch serving's per-token time on each GPU relative to the reference GPU, measured.

    For every set of corpus points measured alike on several GPUs (same source, engine and version,
    model, precision, parallelism, concurrency, lengths), the ratio of each GPU's per-token time to
    the reference GPU's; a GPU's ratio is the median over its pairs. A GPU no source paired with the
    reference is scaled by the datasheet memory bandwidth ratio and listed in ``scaled``.
    """

    def __init__(self, rows: Sequence[Measurement], catalog: GpuCatalog | None = None,
                 reference: str = REFERENCE_GPU, batched_from: int = BATCHED_FROM) -> None:
        self.catalog = catalog or GpuCatalog.load()
        self.reference = reference
        groups: dict[tuple[object, ...], dict[str, float]] = defaultdict(dict)
        for m in rows:
            if m.point.tpot_ms and m.point.concurrency >= batched_from:
                groups[_pair_key(m)][m.point.gpu] = m.point.tpot_ms
        ratios: dict[str, list[float]] = defaultdict(list)
        for by_gpu in groups.values():
            ref = by_gpu.get(reference)
            if ref:
                for gpu, ms in by_gpu.items():
                    ratios[gpu].append(ms / ref)
        self.pairs = {g: len(v) for g, v in ratios.items() if g != reference}
        self.ratios = {g: statistics.median(v) for g, v in ratios.items()}
        self.ratios[reference] = 1.0
        self.scaled: set[str] = set()

    @classmethod
    def load(cls, catalog: GpuCatalog | None = None) -> ServingSpeed:
        return cls(corpus.packaged(), catalog)

    def ratio(self, gpu: str) -> float:
        """Per-token time on ``gpu`` over the reference GPU's."""
        if gpu in self.ratios:
            return self.ratios[gpu]
        spec, ref = self.catalog.lookup(gpu), self.catalog.lookup(self.reference)
        if spec is None or ref is None or spec.hbm_bandwidth_tbs <= 0:
            raise ValueError(f"unknown GPU {gpu!r}")
        self.scaled.add(gpu)
        return ref.hbm_bandwidth_tbs / spec.hbm_bandwidth_tbs

    def seconds(self, manifest: dict[str, Any], duration: float, gpu: str | None) -> float:
        """A batch serving pod's run time on ``gpu``; any other pod keeps ``duration``."""
        try:
            spec = parse_workload(manifest)
        except WorkloadError:
            return duration
        if gpu is None or not _batch_serving(spec):
            return duration
        return duration * self.ratio(gpu)


@dataclass(frozen=True, slots=True)
class Judged:
    """A measured per-token time for a serving pod on a GPU, and how it was read from the corpus."""

    ms_per_token: float
    how: str  # "measured", "interpolated" (between two sizes), "bounded" (by a larger size), "scaled" (up)


class ServingJudge:
    """Interactive serving judged by measurement: the corpus's per-token time at one request.

    A pod is judged on a GPU when the corpus holds dense points on that GPU at one request, with as
    many GPUs as the pod asks and the same bytes per weight as the precision it declares first.
    Between measured model sizes the time is interpolated log-log (decode reads the weights, so it
    grows with size); below the smallest measured size the smallest one's time is taken (a smaller
    model is no slower), above the largest it is scaled in proportion to size. Otherwise the pod is
    not judged (``None``), and the replay counts it as such.
    """

    def __init__(self, rows: Sequence[Measurement]) -> None:
        by: dict[tuple[str, int, float], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        for m in rows:
            p = m.point
            if p.tpot_ms and p.concurrency == 1 and not m.moe:
                by[(p.gpu, p.gpus, p.precision.bytes_per_param)][m.params].append(p.tpot_ms)
        self.curves = {k: Curve(tuple(sorted(v)), tuple(statistics.median(v[x]) for x in sorted(v)))
                       for k, v in by.items()}

    @classmethod
    def load(cls) -> ServingJudge:
        return cls(corpus.packaged())

    def judge(self, spec: WorkloadSpec, gpu: str | None) -> Judged | None:
        if gpu is None or not spec.model_params or spec.gpus <= 0 or spec.active_params:
            return None
        curve = self.curves.get((gpu, spec.gpus, spec.precisions[0].bytes_per_param))
        if curve is None:
            return None
        params, xs = spec.model_params, curve.params
        if params in xs:
            return Judged(curve.values[xs.index(params)], "measured")
        if xs[0] < params < xs[-1]:
            return Judged(curve.at(params), "interpolated")
        if params < xs[0]:  # a smaller model is no slower: the smallest measured size bounds it
            return Judged(curve.values[0], "bounded")
        return Judged(curve.values[-1] * params / xs[-1], "scaled")


TFLOPS_ANNOTATION = "llm-placement.io/gpu-bf16-tflops"
PRODUCT_LABEL = "nvidia.com/gpu.product"
# How a GPU's speed was had: measured rows / pairs, else a datasheet ratio, else a figure the
# scenario declares on its nodes, else none at all (the trace's duration, the reference's speed).
MEASURED, DATASHEET, DECLARED, NONE = "measured", "datasheet", "declared", "none"


def uncatalogued(nodes: list[dict[str, Any]], catalog: GpuCatalog | None = None) -> dict[str, str]:
    """node name -> product label of GPU nodes whose product the catalog lacks."""
    catalog = catalog or GpuCatalog.load()
    out: dict[str, str] = {}
    for n in nodes:
        product = (n["metadata"].get("labels") or {}).get(PRODUCT_LABEL)
        if product and catalog.lookup(product) is None:
            out[n["metadata"]["name"]] = product
    return out


def declared_tflops(nodes: list[dict[str, Any]]) -> dict[str, float]:
    """Product label -> the dense BF16 TFLOPS a scenario declares on its nodes of that product (the
    node annotation operators use, docs/node-facts.md "Throughput"): the truth a replay runs an
    uncatalogued GPU at. Unreadable figures are left out (the product then runs at no known speed)."""
    out: dict[str, float] = {}
    for n in nodes:
        meta = n["metadata"]
        product = (meta.get("labels") or {}).get(PRODUCT_LABEL)
        raw = (meta.get("annotations") or {}).get(TFLOPS_ANNOTATION)
        if product and raw is not None:
            try:
                out[product] = parse_tflops(raw)
            except ValueError:
                continue
    return out


def node_gpus(nodes: list[dict[str, Any]], catalog: GpuCatalog | None = None) -> dict[str, str | None]:
    """node name -> catalog GPU name (from the GPU Feature Discovery product label), None without."""
    catalog = catalog or GpuCatalog.load()
    out: dict[str, str | None] = {}
    for n in nodes:
        product = (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.product")
        spec = catalog.lookup(product) if product else None
        out[n["metadata"]["name"]] = spec.name if spec else None
    return out


class _Pod(Protocol):
    manifest: dict[str, Any]
    duration: float | None


class PodRuntime:
    """A replayed pod's run time on the node it got (the replay driver's ``runtime`` callback).

    Training runs its work at the GPU's measured training speed, batch serving its tokens at the
    GPU's measured per-token time; anything else runs its trace duration. A GPU of a product the
    catalog lacks runs training at the dense BF16 figure its nodes declare
    (``llm-placement.io/gpu-bf16-tflops``) over the reference's, else at the reference's speed (the
    trace's duration, nothing known). ``fallback_used`` names every GPU a pod ran on at a speed not
    measured (a datasheet ratio, a declared figure or none), so each result says which. With the
    trace's pods given, a pod first reads its inputs from where its producers ran (``Inputs``).
    """

    def __init__(self, nodes: list[dict[str, Any]], pods: Sequence[_Pod] = (),
                 training: TrainingSpeed | None = None, serving: ServingSpeed | None = None,
                 catalog: GpuCatalog | None = None) -> None:
        catalog = catalog or GpuCatalog.load()
        self.gpus = node_gpus(nodes, catalog)
        self.unknown = uncatalogued(nodes, catalog)
        self.declared = declared_tflops(nodes)
        self.training = training or TrainingSpeed.load()
        self.serving = serving or ServingSpeed.load(catalog)
        self.inputs = Inputs(nodes, pods) if pods else None
        self.fallback_used: dict[str, str] = {}  # GPU -> how its speed was had, for pods that ran there

    def __call__(self, pod: _Pod, node: str, where: dict[str, str]) -> float:
        duration, gpu = pod.duration or 0.0, self.gpus.get(node)
        if gpu is None and node in self.unknown:
            run = self._uncatalogued(pod, duration, self.unknown[node])
        else:
            run = self.training.seconds(pod.manifest, duration, gpu)
            if run != duration and gpu in self.training.scaled:
                self.fallback_used[gpu] = DATASHEET
            elif run == duration:
                run = self.serving.seconds(pod.manifest, duration, gpu)
                if run != duration and gpu in self.serving.scaled:
                    self.fallback_used[gpu] = DATASHEET
        return run + (self.inputs.seconds(pod.manifest, node, where) if self.inputs else 0.0)

    def _uncatalogued(self, pod: _Pod, duration: float, product: str) -> float:
        """Training on a product the catalog lacks: scaled by its declared figure, else the trace's
        duration; batch serving keeps the trace's duration (no measured or declared bandwidth)."""
        try:
            spec = parse_workload(pod.manifest)
        except WorkloadError:
            return duration
        if spec.gpus <= 0 or not (spec.stage in TRAINING_STAGES or _batch_serving(spec)):
            return duration
        tflops = self.declared.get(product)
        ref = self.training.catalog.lookup(self.training.reference)
        if spec.stage in TRAINING_STAGES and tflops is not None and ref is not None:
            self.fallback_used[product] = DECLARED
            return duration * ref.bf16_tflops / tflops
        self.fallback_used[product] = NONE
        return duration

    def facts(self, params: float = DEFAULT_PARAMS) -> dict[str, Any]:
        """Per GPU in the cluster: its speed ratios to the reference and where they come from."""
        out: dict[str, Any] = {}
        for gpu in sorted({g for g in self.gpus.values() if g}):
            train = self.training.speed(self.training.reference, params) / self.training.speed(gpu, params)
            out[gpu] = {"training_time_ratio": round(train, 4),
                        "training_from": "datasheet BF16 peak" if gpu in self.training.scaled else "measured",
                        "batch_serving_time_ratio": round(self.serving.ratio(gpu), 4),
                        "batch_serving_from": self._serving_source(gpu)}
        ref = self.training.catalog.lookup(self.training.reference)
        for product in sorted(set(self.unknown.values())):
            tflops = self.declared.get(product)
            ratio = ref.bf16_tflops / tflops if tflops is not None and ref is not None else None
            out[product] = {
                "training_time_ratio": round(ratio, 4) if ratio is not None else 1.0,
                "training_from": ("declared BF16 peak (node annotation), not in the catalog" if ratio is not None
                                  else "fallback: the reference GPU's speed (not in the catalog, nothing declared)"),
                "batch_serving_time_ratio": 1.0,
                "batch_serving_from": "fallback: the reference GPU's speed (not in the catalog)"}
        return out

    def _serving_source(self, gpu: str) -> str:
        if gpu == self.serving.reference:
            return "reference"
        if gpu in self.serving.scaled:
            return "datasheet memory bandwidth"
        return f"{self.serving.pairs[gpu]} measured pairs"


class Inputs:
    """Where a pod's inputs sit when it starts, and how long reading them takes (``DataPath``).

    A pod's ``depends-on`` producers are pods or gangs of the trace; a gang's data sits in equal
    shares on its members' nodes. The pod's ``input-data-gb`` is split equally among its producers
    that were placed; a producer never placed costs nothing (its data is nowhere to be read).
    """

    def __init__(self, nodes: list[dict[str, Any]], pods: Sequence[_Pod], path: DataPath | None = None) -> None:
        self.path = path or DataPath.load()
        self.labels = {n["metadata"]["name"]: {**(n["metadata"].get("labels") or {}),
                                               HOSTNAME_LABEL: n["metadata"]["name"]} for n in nodes}
        self.members: dict[str, list[str]] = defaultdict(list)
        for p in pods:
            meta = p.manifest["metadata"]
            group = (meta.get("labels") or {}).get(GANG_LABEL) or (meta.get("annotations") or {}).get(
                GANG_NAME_ANNOTATION)
            if group:
                self.members[group].append(meta["name"])

    def reads(self, manifest: dict[str, Any], node: str, where: dict[str, str]) -> dict[str, TierRead]:
        """GB and seconds of the pod's input reads on ``node`` by tier, innermost first."""
        try:
            spec = parse_workload(manifest)
        except WorkloadError:
            return {}
        placed = {producer: sites for producer in spec.depends_on
                  if (sites := [where[m] for m in self.members.get(producer, [producer]) if m in where])}
        if not placed or spec.input_data_gb <= 0 or node not in self.labels:
            return {}
        out: dict[str, TierRead] = {}
        for sites in placed.values():
            share = spec.input_data_gb / len(placed)
            for tier_name, read in self.path.by_tier(share, self.labels[node],
                                                     [self.labels[s] for s in sites]).items():
                prev = out.get(tier_name)
                out[tier_name] = read if prev is None else TierRead(prev.gb + read.gb, prev.seconds + read.seconds)
        return out

    def seconds(self, manifest: dict[str, Any], node: str, where: dict[str, str]) -> float:
        return sum(r.seconds for r in self.reads(manifest, node, where).values())
