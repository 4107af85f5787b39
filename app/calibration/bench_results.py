"""Serving-benchmark result files as calibration measurements (``calibrate --bench``).

vLLM's ``--save-result`` JSON and SGLang's ``bench_serving`` JSONL say what was measured (time per
output token, time to first token, prompt and output lengths, the concurrency cap), not on what:
the model, GPU, precision and GPU count come from the command line, as for ``profiles import``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from app.base.catalog import default_catalog
from app.base.datafile import problems
from app.base.model_registry import default_registry
from app.calibration.corpus import Measurement, Point, Source
from app.serving.profiles_import import BenchmarkImportError, Statistic, read_runs


@dataclass(frozen=True, slots=True)
class BenchmarkRows:
    files: tuple[Path, ...]
    model: str | None
    gpu: str | None
    precision: str | None
    gpus: int


def bench_rows(spec: BenchmarkRows) -> list[Measurement]:
    missing = [n for n in ("model", "gpu", "precision") if getattr(spec, n) is None]
    if missing:
        raise ValueError("--bench needs " + ", ".join(f"--{m}" for m in missing))
    assert spec.model is not None and spec.gpu is not None and spec.precision is not None
    gpu = default_catalog().lookup(spec.gpu)
    if gpu is None:
        raise ValueError(f"--gpu {spec.gpu!r} is not in the GPU catalog (llm-placement catalog lists them)")
    arch = default_registry().get(spec.model)
    if arch is None:
        raise ValueError(f"--model {spec.model!r} is not in the model registry "
                         f"(nearest: {default_registry().nearest(spec.model)})")
    out = []
    for path in spec.files:
        try:
            runs = read_runs(path, Statistic.MEDIAN)
        except BenchmarkImportError as exc:
            raise ValueError(str(exc)) from None
        source = Source(id=f"bench:{path}", title=path.name, url=str(path), kind="user-benchmark")
        for run in runs:
            if run.prompt_tokens is None or run.output_tokens is None:
                raise ValueError(f"{run.origin}: no total_input_tokens / total_output_tokens / completed: "
                                 "the lengths the latency was measured at are unknown")
            try:
                point = Point(locator=run.origin, engine=run.tool, model=arch.name,
                              precision=spec.precision, gpu=gpu.name,
                              gpus=spec.gpus, tp=spec.gpus, concurrency=run.max_concurrency or 1,
                              input_tokens=run.prompt_tokens, output_tokens=run.output_tokens,
                              tpot_ms=run.tpot_ms, tpot_stat="median", ttft_ms=run.ttft_ms)
            except ValidationError as exc:
                raise ValueError(f"{run.origin}: {problems(exc)}") from None
            out.append(Measurement(source=source, point=point, gpu=gpu, arch=arch, params=arch.params,
                                   active_params=arch.active_params, file=str(path)))
    return out
