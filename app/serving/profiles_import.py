"""Measured profiles from serving benchmarks' result files (``llm-placement profiles import``).

Two formats, both one summary per benchmark run (docs/stage-policy.md, "Importing benchmark
results"):

* vLLM ``benchmarks/benchmark_serving.py --save-result`` (and ``vllm bench serve --save-result``):
  one JSON object per file;
* SGLang ``python -m sglang.bench_serving --output-file F.jsonl``: one JSON object per line, a line
  appended per run.

Both write the same summary fields, which is all this reads: ``{mean,median,p99}_tpot_ms`` (time per
output token after the first: decode's ms/token), ``{mean,median,p99}_ttft_ms`` (time to first
token), ``total_input_tokens`` / ``completed`` (the mean prompt length the TTFT was measured at),
``max_concurrency`` (the benchmark's cap on requests in flight), and ``model_id`` and ``date``
(vLLM) or ``server_info.model_path`` (SGLang) where present, for the entry's name and source.
What the files do not say (the model's parameter count, the GPU product and count, the
precision) comes from the command line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.base.catalog import GpuCatalog
from app.base.userfiles import (
    MAX_ROW_CLIENTS,
    MAX_ROW_MS_PER_TOKEN,
    MAX_ROW_TOKENS,
    MAX_ROW_TTFT_MS,
    check_json_depth,
    read_user_text,
)
from app.base.workload import Precision
from app.serving.profiles import Profile, ProfileBook, ProfileError, same_slot

# A result file is a summary (vLLM's --save-detailed adds per-request lists: a few MB for thousands of
# requests); larger is not a benchmark result.
MAX_RESULT_BYTES = 16 << 20


class BenchmarkImportError(ValueError):
    """A result file cannot be imported; the message is one line naming the file (and line)."""


class Statistic(StrEnum):
    """Which summary of the per-request figures becomes the profile's figure."""

    MEDIAN = "median"  # the default: typical latency, not moved by a few slow requests
    MEAN = "mean"
    P99 = "p99"  # conservative: what nearly every request got


@dataclass(frozen=True, slots=True)
class Run:
    """One benchmark run's summary, as the result file gives it."""

    origin: str  # file, or file:line for JSONL
    tool: str
    tpot_ms: float | None
    ttft_ms: float | None
    prompt_tokens: int | None
    max_concurrency: int | None
    model_id: str | None
    date: str | None
    output_tokens: int | None = None  # mean generated tokens per request, when the file says


def _positive(value: Any, name: str, origin: str, most: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BenchmarkImportError(f"{origin}: field {name!r} is {value!r}, not a number of milliseconds")
    if value > most:
        raise BenchmarkImportError(f"{origin}: field {name!r} is {value!r} ms, more than {most:,.0f}: "
                                   "not a serving measurement")
    if value <= 0:
        # SGLang writes 0 (or -0.0) when every request produced a single token: nothing measured.
        raise BenchmarkImportError(
            f"{origin}: {name} is {value!r}: no decode was measured (one-token outputs?)")
    return float(value)


def _run(record: Any, origin: str, stat: Statistic) -> Run:
    if not isinstance(record, dict):
        raise BenchmarkImportError(f"{origin}: expected a JSON object with the benchmark's summary, got "
                           f"{type(record).__name__}")
    tpot_key, ttft_key = f"{stat.value}_tpot_ms", f"{stat.value}_ttft_ms"
    if tpot_key not in record and ttft_key not in record:
        raise BenchmarkImportError(f"{origin}: no {tpot_key} or {ttft_key}: not a vLLM benchmark_serving "
                           "--save-result or SGLang bench_serving result")
    tpot = _positive(record.get(tpot_key), tpot_key, origin, MAX_ROW_MS_PER_TOKEN)
    ttft = _positive(record.get(ttft_key), ttft_key, origin, MAX_ROW_TTFT_MS)
    prompt: int | None = None
    total_in, completed = record.get("total_input_tokens"), record.get("completed")
    if isinstance(total_in, int) and isinstance(completed, int) and total_in > 0 and completed > 0:
        prompt = max(1, round(total_in / completed))
    output: int | None = None
    total_out = record.get("total_output_tokens")
    if isinstance(total_out, int) and isinstance(completed, int) and total_out > 0 and completed > 0:
        output = max(1, round(total_out / completed))
    if prompt is None and isinstance(total_in, int) and isinstance(completed, int) and completed > 0:
        prompt = max(1, round(total_in / completed)) if total_in > 0 else None
    for name, value in (("prompt tokens per request", prompt), ("output tokens per request", output)):
        if value is not None and value > MAX_ROW_TOKENS:
            raise BenchmarkImportError(f"{origin}: field 'total_input_tokens'/'total_output_tokens': {name} "
                                       f"{value:,}, more than {MAX_ROW_TOKENS:,}")
    cap = record.get("max_concurrency")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int)
                            or not 0 < cap <= MAX_ROW_CLIENTS):
        raise BenchmarkImportError(f"{origin}: field 'max_concurrency' is {cap!r}, not an integer "
                                   f"from 1 to {MAX_ROW_CLIENTS:,}")
    # vLLM names the model it benchmarked; SGLang's summary only through the server's info, if any.
    tool = "vLLM benchmark_serving" if "model_id" in record else "SGLang bench_serving"
    server = record.get("server_info")
    model_id = record.get("model_id") or (server.get("model_path") if isinstance(server, dict) else None)
    date = record.get("date")
    return Run(origin, tool, tpot, ttft, prompt if ttft is not None else None, cap,
               model_id if isinstance(model_id, str) and model_id.strip() else None,
               date if isinstance(date, str) else None, output)


def read_runs(path: Path, stat: Statistic = Statistic.MEDIAN) -> list[Run]:
    """Every run in one result file: a JSON object (vLLM) or JSON lines (SGLang)."""
    origin = str(path)
    # One reader for every user file (app/base/userfiles.py): a regular file, the size counted while
    # reading, no NUL, UTF-8, nesting checked before any JSON parser sees it.
    text = read_user_text(path, BenchmarkImportError, MAX_RESULT_BYTES)
    check_json_depth(text, origin, BenchmarkImportError)
    if not text.strip():
        raise BenchmarkImportError(f"{origin}: empty file")
    try:
        whole_doc = json.loads(text)
    except json.JSONDecodeError as exc:
        whole = exc  # perhaps JSON lines: one run per line
    else:
        return [_run(whole_doc, origin, stat)]
    runs: list[Run] = []
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            # Not even the first line parses: a broken JSON file, so say where the file breaks.
            bad = whole if not runs else exc
            where = f"line {bad.lineno if not runs else no}, column {bad.colno}"
            raise BenchmarkImportError(f"{origin}: not valid JSON ({bad.msg} at {where})") from None
        runs.append(_run(record, f"{origin}:{no}", stat))
    return runs


def choose(runs: list[Run], concurrency: int | None) -> Run:
    """The run to keep: the one at ``concurrency`` if given, else the one at the highest cap.

    A profile entry holds one figure per model, GPU and precision, valid up to its
    ``max_concurrency``; the run at the highest concurrency covers the most pods, and its ms/token
    is what a pod with fewer sequences gets at most (decode gets slower as the batch grows).
    """
    if concurrency is not None:
        hits = [r for r in runs if r.max_concurrency == concurrency]
        if not hits:
            seen = sorted({r.max_concurrency for r in runs if r.max_concurrency is not None})
            raise BenchmarkImportError(f"no run at max_concurrency {concurrency} (runs at: "
                               f"{', '.join(map(str, seen)) or 'none capped'})")
        return hits[-1]
    capped = [r for r in runs if r.max_concurrency is not None]
    if capped and len(capped) < len(runs):
        uncapped = next(r.origin for r in runs if r.max_concurrency is None)
        raise BenchmarkImportError(f"{uncapped}: a run without max_concurrency among capped runs: import it "
                           "on its own or pass --concurrency")
    return max(capped, key=lambda r: r.max_concurrency or 0) if capped else runs[-1]


def build_profile(
    run: Run, *, model: str | None, model_params: str, active_params: str | None, gpu: str,
    gpus: int, precision: Precision, stat: Statistic, catalog: GpuCatalog,
) -> Profile:
    spec = catalog.lookup(gpu)
    if spec is None:
        raise BenchmarkImportError(
            f"--gpu {gpu!r} is not in the GPU catalog (llm-placement catalog lists them)")
    name = model or (run.model_id.rstrip("/").rsplit("/", 1)[-1] if run.model_id else None)
    if not name:
        raise BenchmarkImportError(f"{run.origin}: the result does not name the model: pass --model")
    what = " ".join(x for x in (run.tool, run.date) if x)
    cap = f", max_concurrency {run.max_concurrency}" if run.max_concurrency else ""
    data = {
        "model": name, "model_params": model_params, "active_params": active_params,
        "gpu": spec.name, "gpus": gpus, "precision": precision.value,
        "ms_per_token": run.tpot_ms, "ttft_ms": run.ttft_ms, "prompt_tokens": run.prompt_tokens,
        "max_concurrency": run.max_concurrency,
        "source": f"{what}: {stat.value} TPOT/TTFT{cap} ({Path(run.origin).name})",
    }
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "profile"
        raise BenchmarkImportError(f"{where}: {first['msg']}") from None
    except ValueError as exc:  # a parameter count the parser refuses
        raise BenchmarkImportError(str(exc)) from None


def merge(existing: Iterable[Profile], new: Profile) -> list[Profile]:
    """``existing`` with ``new`` in place of every entry for the same model size, GPU, count and
    precision (a file holding both would be refused at load: a pod would match either), else
    appended."""
    out, replaced = [], False
    for p in existing:
        if same_slot(p, new):
            if not replaced:
                out.append(new)
                replaced = True
            continue
        out.append(p)
    return out if replaced else [*out, new]


def param_count(p: float) -> str:
    """8e9 -> "8B", the way people and model cards write it (read back by ``parse_param_count``)."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if p >= scale:
            return f"{p / scale:.6g}{suffix}"
    return f"{p:.6g}"


def to_document(entries: Iterable[Profile]) -> dict[str, Any]:
    """The profiles file's content (the format ``ProfileBook.load`` reads), without empty fields."""
    out = []
    for p in entries:
        d = p.model_dump(mode="json", exclude_none=True)
        d["model_params"] = param_count(p.model_params)
        if p.active_params is not None:
            d["active_params"] = param_count(p.active_params)
        out.append(d)
    return {"profiles": out}


def load_existing(path: Path) -> list[Profile]:
    """The entries of an existing profiles file (validated), or none when it does not exist."""
    if not path.exists():
        return []
    try:
        return list(ProfileBook.load(path).entries)
    except ProfileError as exc:
        raise BenchmarkImportError(str(exc)) from None
