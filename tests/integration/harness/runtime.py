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

Serving and other pods keep their trace duration (a service runs for its lifetime, not a fixed
amount of work). Data transfer time is not modelled here.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.core.catalog import GpuCatalog
from app.core.workload import TRAINING_STAGES, WorkloadError, parse_workload

DATA = Path(__file__).resolve().parents[3] / "bench" / "data" / "training_throughput.yaml"
REFERENCE_GPU = "H100-SXM-80GB"
DEFAULT_PARAMS = 7e9  # a training pod without model-params is taken as a 7B model


@dataclass(frozen=True, slots=True)
class Curve:
    """One GPU's measured tokens/s/GPU by model size (sorted by size)."""

    params: tuple[float, ...]
    tokens_per_s: tuple[float, ...]

    def at(self, params: float) -> float:
        """Log-log interpolation; flat beyond the measured ends (no extrapolation)."""
        xs, ys = self.params, self.tokens_per_s
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


def node_gpus(nodes: list[dict[str, Any]], catalog: GpuCatalog | None = None) -> dict[str, str | None]:
    """node name -> catalog GPU name (from the GPU Feature Discovery product label), None without."""
    catalog = catalog or GpuCatalog.load()
    out: dict[str, str | None] = {}
    for n in nodes:
        product = (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.product")
        spec = catalog.lookup(product) if product else None
        out[n["metadata"]["name"]] = spec.name if spec else None
    return out
