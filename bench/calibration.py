"""How far the serving estimate is from published measurements, before and after calibration.

For every point of the measurement corpus (app/data/measurements) it prints, per group (dense,
int4, int8/fp8, MoE, tensor parallel >= 4, concurrency >= 16, all), the median, 10th/90th
percentile and worst estimate / measured ratio of the time per output token and to first token,
and the count of wrong verdicts at a 1.3x margin:

* before: the roofline the filter used until the serving model (bytes / (GPUs x bandwidth x 0.6)
  plus NCCL's all-reduce cost, prefill at half the dense BF16 peak), re-stated here;
* after, cross-validated: each source predicted by a fit to all the other sources;
* after, fit to all: the shipped calibration (what the filter uses).

Then the verdicts of the filter's target check with each group's error quantile (docs/stage-policy.md,
"Target decision") on the shipped calibration, and through the real filter.

It also runs every corpus deployment through the real filter (``feasibility.evaluate``, default
settings, the packaged catalog) with no latency target and counts the ones refused for memory:
each of them is known to run, so every refusal is wrong.

    python bench/calibration.py [--json bench/results/calibration.json] [--markdown]
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Annotated

import typer

from app.base.catalog import default_catalog
from app.base.reasons import ReasonCode
from app.base.workload import Stage, WorkloadSpec
from app.calibration import corpus, fit
from app.calibration.corpus import Measurement
from app.placement.feasibility import NodeFit, evaluate
from app.serving.model import DEFAULT_CONFIDENCE, MISS, ServingCalibration, default_calibration
from app.serving.sizing import allreduce_us, gpu_link, shape
from app.snapshot.nodes import NodeFacts, NodeLabelKeys, node_facts
from app.snapshot.store import NodeUsage

SHIPPED = "after, shipped calibration (fit to all)"
LEGACY_BANDWIDTH_EFFICIENCY = 0.6
LEGACY_PREFILL_EFFICIENCY = 0.5


def legacy(row: Measurement) -> tuple[float, float]:
    """(ms per token, ms to first token) by the former roofline, for the 'before' column."""
    p = row.point
    active = row.active_params or row.params
    layers, hidden = shape(active)
    gqa = 1 / 8 if active >= 30e9 else 1 / 4
    kv_token = 2 * layers * hidden * 2.0 * gqa
    kv = (p.input_tokens + p.output_tokens) * p.concurrency * kv_token / 1e9
    weights = row.params * p.precision.bytes_per_param / 1e9
    share = 1.0
    if row.active_params is not None and row.active_params < row.params:
        share = min(1.0, 1 - (1 - row.active_params / row.params) ** p.concurrency)
    read = weights * share + kv
    ms = read / (p.gpus * row.gpu.hbm_bandwidth_tbs * LEGACY_BANDWIDTH_EFFICIENCY)
    peak = p.gpus * row.gpu.bf16_tflops * 1e12
    ttft = 2 * p.input_tokens * active / (peak * LEGACY_PREFILL_EFFICIENCY) * 1e3
    if p.gpus > 1:
        link = gpu_link(row.gpu)
        ms += 2 * layers * allreduce_us(p.concurrency * hidden * 2.0, p.gpus, link) / 1e3
        ttft += 2 * layers * allreduce_us(p.input_tokens * hidden * 2.0, p.gpus, link) / 1e3
    return ms, ttft


def legacy_ratios(rows: list[Measurement]) -> list[fit.Ratio]:
    out = []
    for row in rows:
        ms, ttft = legacy(row)
        if row.point.tpot_ms is not None:
            out.append(fit.Ratio(row, "tpot", fit.per_token(row, ms, ttft), row.point.tpot_ms))
        if row.point.ttft_ms is not None:
            out.append(fit.Ratio(row, "ttft", ttft, row.point.ttft_ms))
    return out


def node_for(row: Measurement) -> NodeFacts:
    """A node of exactly the measured GPUs, labelled as GPU Feature Discovery labels it."""
    node = {"metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": row.gpu.name}},
            "status": {"allocatable": {"nvidia.com/gpu": str(row.point.gpus), "cpu": "64",
                                       "memory": "1024Gi", "pods": "110"}}}
    return node_facts(node, default_catalog(), NodeLabelKeys())


def spec_for(row: Measurement, *, concurrency: bool, **targets: float) -> WorkloadSpec:
    p = row.point
    return WorkloadSpec(namespace="b", name="p", stage=Stage.SERVING, model_params=row.params,
                        active_params=row.active_params, model=row.arch.name if row.arch else None,
                        precision=p.precision, gpus=p.gpus, concurrency=p.concurrency if concurrency else 1,
                        context_tokens=p.input_tokens + p.output_tokens, prompt_tokens=p.input_tokens,
                        **targets)


def filter_verdicts(rows: list[Measurement]) -> dict[str, int]:
    """Each measured point through the real filter (``feasibility.evaluate``, shipped settings) with
    a target the measurement misses by just over MISS (accepting it is wrong) and one it meets with
    MISS to spare (refusing it is wrong), for per-token and first-token targets."""
    from app.config.settings import Settings

    policy = Settings(cluster_source="none", metrics_port=0).policies().placement.feasibility
    out = {"judged": 0, "accepted_but_misses": 0, "refused_but_runs": 0, "not_judged_memory": 0}
    for row in rows:
        p = row.point
        for key, measured in (("max_ms_per_token", p.tpot_ms if p.tpot_stat != "e2e" else None),
                              ("max_ttft_ms", p.ttft_ms)):
            if measured is None:
                continue
            node = node_for(row)
            missed = evaluate(spec_for(row, concurrency=True, **{key: measured / MISS * 0.999}), node,
                              NodeUsage(), p.gpus, policy)
            met = evaluate(spec_for(row, concurrency=True, **{key: measured * MISS}), node,
                           NodeUsage(), p.gpus, policy)
            if any(not isinstance(g, NodeFit) and g.code is not ReasonCode.LATENCY_SLO
                   for g in (missed, met)):
                out["not_judged_memory"] += 1
                continue
            out["judged"] += 1
            out["accepted_but_misses"] += isinstance(missed, NodeFit)
            out["refused_but_runs"] += not isinstance(met, NodeFit)
    return out


def memory_refusals(rows: list[Measurement], cal: ServingCalibration, *, concurrency: bool = False
                    ) -> list[tuple[Measurement, str]]:
    """Deployments the filter refuses for memory. By default with one sequence's KV cache: the
    deployment started, which is what the measurement proves (an engine holds fewer sequences at
    once than asked when their KV cache does not fit, and queues the rest). ``concurrency``: with
    the whole batch's KV cache, which a pod declaring that concurrency is sized for."""
    from app.config.settings import Settings

    policy = Settings(cluster_source="none", metrics_port=0).policies().placement.feasibility
    out = []
    for row in rows:
        p = row.point
        got = evaluate(spec_for(row, concurrency=concurrency), node_for(row), NodeUsage(), p.gpus, policy)
        if not isinstance(got, NodeFit) and got.code in (ReasonCode.GPU_MEMORY, ReasonCode.PRECISION):
            out.append((row, got.message))
    return out


def markdown(title: str, stats: list[fit.GroupStats]) -> str:
    lines = [f"**{title}**", "",
             "| group | n | median | p10 | p90 | worst | optimistic > 1.3x | pessimistic > 1.3x "
             "| within 0.7-1.4 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in stats:
        lines.append(f"| {s.group} | {s.n} | {s.median:.2f} | {s.p10:.2f} | {s.p90:.2f} | {s.worst:.2f} | "
                     f"{s.optimistic} | {s.pessimistic} | {s.within:.0%} |")
    return "\n".join(lines) + "\n"


def main(
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
    folder: Annotated[Path | None, typer.Option(
        help="Measurement folder (default: packaged corpus).")] = None,
) -> None:
    rows = corpus.load([folder]) if folder else corpus.packaged()
    info = corpus.summary(rows)
    print(f"{info['points']} measurements, {info['sources']} sources, GPUs {', '.join(info['gpus'])}\n")
    shipped = default_calibration()
    results: dict[str, object] = {"corpus": info}
    variants = {
        "before (former roofline)": legacy_ratios(rows),
        "after, cross-validated (leave one source out)": fit.cross_validate(rows, ServingCalibration()),
        SHIPPED: fit.predict(rows, shipped),
    }
    for metric, label in (("tpot", "time per output token"), ("ttft", "time to first token")):
        for name, ratios in variants.items():
            stats = fit.table(ratios, metric)
            print(markdown(f"{label}, estimate / measured: {name}", stats))
            results[f"{metric}: {name}"] = [dataclasses.asdict(s) for s in stats]
    print(f"**target verdicts at {DEFAULT_CONFIDENCE:g} confidence over the shipped calibration's own "
          "errors (in-sample; bench/serving_decisions.py judges each source with figures made "
          "without it)**\n")
    print(f"| metric | group | n | quantile (median) | false accepts at {fit.MISSED}x | "
          f"false refusals at {fit.MET}x |")
    print("|---|---|---:|---:|---:|---:|")
    got = fit.verdicts(variants[SHIPPED], fit.quantile_factor(shipped, DEFAULT_CONFIDENCE))
    for v in got:
        print(f"| {v.metric} | {v.group} | {v.n} | {v.factor:.2f} | {v.false_accepts} | {v.false_refusals} |")
    results["verdicts: shipped calibration"] = [dataclasses.asdict(v) for v in got]
    real = filter_verdicts(rows)
    print(f"\nthrough the real filter (shipped settings, each point's concurrency; per-token rows "
          f"measured end to end are left to the table above): {real}\n")
    results["filter_verdicts"] = real
    refused = memory_refusals(rows, shipped)
    print(f"corpus deployments refused for memory by the filter: {len(refused)} of {len(rows)}")
    for row, why in refused:
        print(f"  {row.source.id}: {row.point.locator}: {why}")
    whole = memory_refusals(rows, shipped, concurrency=True)
    print(f"... and with the whole batch's KV cache (the engine queued part of it): "
          f"{len(whole)} of {len(rows)}")
    results["memory_refusals_whole_batch"] = len(whole)
    results["memory_refusals"] = [{"source": r.source.id, "locator": r.point.locator, "reason": w}
                                  for r, w in refused]
    if json_out:
        json_out.write_text(json.dumps(results, indent=1, default=lambda o: None if isinstance(o, float)
                                       and not math.isfinite(o) else str(o)) + "\n")


if __name__ == "__main__":
    typer.run(main)
