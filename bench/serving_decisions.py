"""How often the serving filter's target check says no to a target the hardware meets, and yes to
one it misses, each corpus source judged by a calibration made without it.

Leave one source out: the serving model is fitted to every other source, and the decision rule's
figures (today: each group's margin) come from those other sources only; the held-out source's
points are then judged with a target at 1.2x the measured time (refusing it is a false refusal)
and at 0.75x (accepting it is a false accept). Rates are printed per metric (per output token,
first token), per corpus group (docs/stage-policy.md, "How good the estimate is") and per engine as
the corpus records it.

Memory: every corpus deployment, written as a pod with its own concurrency, prompt and output
lengths, goes through the real filter (``feasibility.evaluate``, shipped settings) with no latency
target; each one is known to run, so every memory refusal is false.

    python bench/serving_decisions.py [--json bench/results/serving_decisions.json]
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from app.base.catalog import default_catalog
from app.base.reasons import ReasonCode
from app.base.workload import Stage, WorkloadSpec
from app.calibration import corpus, fit
from app.calibration.corpus import Measurement
from app.config.settings import Settings
from app.placement.feasibility import NodeFit, evaluate
from app.serving.model import (
    DEFAULT_CONFIDENCE,
    FALSE_ACCEPT_BUDGET,
    ErrorQuantiles,
    ServingCalibration,
    target_quantile,
)
from app.snapshot.nodes import NodeFacts, NodeLabelKeys, node_facts
from app.snapshot.store import NodeUsage

MET = 1.2  # target = 1.2x measured: the hardware meets it with 20 % to spare
MISSED = 0.75  # target = 0.75x measured: the hardware misses it by a third
MIN_GROUP = 10  # groups with fewer points are printed but not held to the rates


@dataclass(frozen=True, slots=True)
class Judged:
    """One held-out measurement and the factor the decision rule multiplied its estimate by."""

    ratio: fit.Ratio
    factor: float

    @property
    def judged(self) -> float:
        return self.ratio.ratio * self.factor  # estimate x factor / measured

    @property
    def false_refusal(self) -> bool:
        return self.judged > MET

    @property
    def false_accept(self) -> bool:
        return self.judged <= MISSED


Rule = Callable[[ServingCalibration, Sequence[Measurement], "HeldOut"], Callable[[fit.Ratio], float]]


@dataclass(frozen=True, slots=True)
class HeldOut:
    """The other sources' cross-validated estimates: as pods that name their engine (the corpus
    row's) and as pods that do not."""

    named: Sequence[fit.Ratio]
    unstated: Sequence[fit.Ratio]


def margin_rule(cal: ServingCalibration, rest: Sequence[Measurement], _cv: HeldOut
                ) -> Callable[[fit.Ratio], float]:
    """The former rule: per metric and narrowest group, the smallest factor (at least 1) under which
    no point of the other sources, estimated in-sample, is accepted at a target it misses by more
    than 1.3x (its worst point sets it)."""
    table: dict[str, dict[str, float]] = {}
    for r in fit.predict(rest, cal, engine=False):
        need = max(1.0, r.measured / r.estimated / 1.3)
        for key in (fit.group_of(r.row), "all"):
            got = table.setdefault(r.metric, {})
            got[key] = max(got.get(key, 1.0), math.ceil(need * 100 - 1e-9) / 100)

    def factor(r: fit.Ratio) -> float:
        got = table.get(r.metric, {})
        return got.get(fit.group_of(r.row), got.get("all", 1.0))
    return factor


def quantile_rule(confidence: float, engine: bool = False) -> Rule:
    """The filter's rule: the group's quantile of measured / estimate at ``confidence`` over the
    other sources' cross-validated errors (what ``llm-placement calibrate`` records); ``engine``:
    each pod names its engine (the corpus row's), as the ``serving-engine`` annotation does."""
    def rule(cal: ServingCalibration, _rest: Sequence[Measurement], cv: HeldOut
             ) -> Callable[[fit.Ratio], float]:
        table = fit.error_quantiles(cv.named, cv.unstated) if engine else fit.error_quantiles(cv.unstated)
        recorded = cal.model_copy(update={"error_quantiles": table})
        return (fit.engine_factor if engine else fit.quantile_factor)(recorded, confidence)
    rule.engine_named = engine  # type: ignore[attr-defined]
    return rule


RULES: dict[str, Rule] = {"worst-point margin (former)": margin_rule,
                          f"quantile at {DEFAULT_CONFIDENCE:g} (default confidence)":
                          quantile_rule(DEFAULT_CONFIDENCE),
                          f"quantile at {DEFAULT_CONFIDENCE:g}, engine named (serving-engine)":
                          quantile_rule(DEFAULT_CONFIDENCE, engine=True)}
SWEEP = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def judge(rows: Sequence[Measurement], rules: dict[str, Rule],
          progress: Callable[[str], None] = lambda _s: None) -> dict[str, list[Judged]]:
    """Every point judged by every rule, its source left out of the fit and of the rule's figures.

    A rule that needs cross-validated errors gets those of the other sources from the same
    leave-one-source-out pass (each predicted by a fit without it; that fit saw the judged source,
    a leak the nested version, 14 times slower, would close)."""
    sources = sorted({r.source.id for r in rows})
    fits: dict[str, ServingCalibration] = {}
    named: dict[str, list[fit.Ratio]] = {}
    unstated: dict[str, list[fit.Ratio]] = {}
    for source in sources:
        progress(source)
        fits[source] = fit.fit([r for r in rows if r.source.id != source], ServingCalibration())
        mine = [r for r in rows if r.source.id == source]
        named[source] = fit.predict(mine, fits[source])
        unstated[source] = fit.predict(mine, fits[source], engine=False)
    out: dict[str, list[Judged]] = {name: [] for name in rules}
    for source in sources:
        rest = [r for r in rows if r.source.id != source]
        cv = HeldOut([x for s in sources if s != source for x in named[s]],
                     [x for s in sources if s != source for x in unstated[s]])
        for name, rule in rules.items():
            factor = rule(fits[source], rest, cv)
            held = named if getattr(rule, "engine_named", False) else unstated
            out[name].extend(Judged(r, factor(r)) for r in held[source])
    return out


def judge_sweep(rows: Sequence[Measurement], judged: dict[str, list[Judged]]) -> list[dict[str, object]]:
    """The quantile rule at each confidence of SWEEP, from the same held-out estimates."""
    base = next(iter(judged.values()))
    by_source: dict[str, list[fit.Ratio]] = {}
    for j in base:
        by_source.setdefault(j.ratio.row.source.id, []).append(j.ratio)
    tables = {s: fit.error_quantiles([r for o, got in by_source.items() if o != s for r in got])
              for s in by_source}
    out: list[dict[str, object]] = []
    for confidence in SWEEP:
        got = [Judged(r, target_quantile_of(tables[r.row.source.id], r, confidence)) for r in
               (j.ratio for j in base)]
        for metric in ("tpot", "ttft"):
            table = [t for t in rates(got) if t["metric"] == metric]
            overall = next(t for t in table if t["group"] == "all")
            big = [t for t in table if int(str(t["n"])) >= MIN_GROUP]
            fr = max(big, key=lambda t: float(str(t["false_refusal"])))
            fa = max(big, key=lambda t: float(str(t["false_accept"])))
            out.append({"confidence": confidence, "metric": metric,
                        "false_refusal": overall["false_refusal"], "false_accept": overall["false_accept"],
                        "worst_refusal": f"{fr['group']} {float(str(fr['false_refusal'])):.0%}",
                        "worst_accept": f"{fa['group']} {float(str(fa['false_accept'])):.0%}"})
    return out


def confidence_by_rule(sweep: Sequence[dict[str, object]], budget: float = FALSE_ACCEPT_BUDGET
                       ) -> float | None:
    """The rule that sets the default ``serving_confidence`` (app/serving/model.py): the
    lowest swept confidence whose overall per-token false-accept rate is at most ``budget``.

    Per token only: first-token false accepts stay above 2 % at every confidence of the sweep
    (the error is wider than the rule can buy back), so that metric cannot choose one."""
    ok = [float(str(line["confidence"])) for line in sweep
          if line["metric"] == "tpot" and float(str(line["false_accept"])) <= budget + 1e-12]
    return min(ok) if ok else None


def target_quantile_of(table: dict[str, dict[str, ErrorQuantiles]], r: fit.Ratio, confidence: float
                       ) -> float:
    cal = ServingCalibration(error_quantiles=table)
    return target_quantile(cal, fit.group_of(r.row), r.metric, confidence, r.row.point.concurrency).factor


def groups(j: Judged) -> list[str]:
    names = [name for name, member in fit.GROUPS.items() if member(j.ratio)]
    return [*names, f"engine {j.ratio.row.point.engine}"]


def rates(judged: Sequence[Judged]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for metric in ("tpot", "ttft"):
        names: dict[str, list[Judged]] = {}
        for j in judged:
            if j.ratio.metric == metric:
                for name in groups(j):
                    names.setdefault(name, []).append(j)
        for name, members in names.items():
            n = len(members)
            out.append({"metric": metric, "group": name, "n": n,
                        "false_refusal": sum(j.false_refusal for j in members) / n,
                        "false_accept": sum(j.false_accept for j in members) / n,
                        "factor_median": sorted(j.factor for j in members)[n // 2]})
    return out


def node_for(row: Measurement) -> NodeFacts:
    node = {"metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": row.gpu.name}},
            "status": {"allocatable": {"nvidia.com/gpu": str(row.point.gpus), "cpu": "64",
                                       "memory": "1024Gi", "pods": "110"}}}
    return node_facts(node, default_catalog(), NodeLabelKeys())


def pod_for(row: Measurement) -> WorkloadSpec:
    """The deployment as a user writes it: its model, GPUs, clients and request lengths."""
    p = row.point
    return WorkloadSpec(namespace="b", name="p", stage=Stage.SERVING, model_params=row.params,
                        active_params=row.active_params, model=row.arch.name if row.arch else None,
                        precision=p.precision, gpus=p.gpus, concurrency=p.concurrency,
                        context_tokens=p.input_tokens + p.output_tokens, prompt_tokens=p.input_tokens)


def memory_refusals(rows: Sequence[Measurement]) -> list[tuple[Measurement, str]]:
    policy = Settings(cluster_source="none", metrics_port=0).policies().placement.feasibility
    out = []
    for row in rows:
        got = evaluate(pod_for(row), node_for(row), NodeUsage(), row.point.gpus, policy)
        if not isinstance(got, NodeFit) and got.code in (ReasonCode.GPU_MEMORY, ReasonCode.PRECISION):
            out.append((row, got.message))
    return out


def markdown(name: str, table: list[dict[str, object]]) -> str:
    lines = [f"**rule: {name}** (leave one source out; false refusal at target = {MET}x measured, "
             f"false accept at {MISSED}x)", "",
             "| metric | group | n | false refusals | false accepts | factor (median) |",
             "|---|---|---:|---:|---:|---:|"]
    for t in table:
        lines.append(f"| {t['metric']} | {t['group']} | {t['n']} | {t['false_refusal']:.0%} | "
                     f"{t['false_accept']:.0%} | {t['factor_median']:.2f} |")
    return "\n".join(lines) + "\n"


def main(
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
    folder: Annotated[Path | None, typer.Option(
        help="Measurement folder (default: packaged corpus).")] = None,
) -> None:
    rows = corpus.load([folder]) if folder else corpus.packaged()
    info = corpus.summary(rows)
    print(f"{info['points']} measurements, {info['sources']} sources\n")
    judged = judge(rows, RULES, progress=lambda s: print(f"  fit without {s}", flush=True))
    results: dict[str, object] = {"corpus": info}
    for name, got in judged.items():
        table = rates(got)
        print(markdown(name, table))
        results[name] = table
    sweep = judge_sweep(rows, judged)
    print("**the quantile rule at other confidences** (overall, and the worst group of >= "
          f"{MIN_GROUP} points)\n")
    print("| confidence | metric | false refusals | worst group | false accepts | worst group |")
    print("|---:|---|---:|---|---:|---|")
    for line in sweep:
        print(f"| {line['confidence']:g} | {line['metric']} | {line['false_refusal']:.0%} | "
              f"{line['worst_refusal']} | {line['false_accept']:.1%} | {line['worst_accept']} |")
    chosen = confidence_by_rule(sweep)
    print(f"\nlowest confidence with per-token false accepts <= {FALSE_ACCEPT_BUDGET:.0%}: {chosen} "
          f"(the shipped default is {DEFAULT_CONFIDENCE:g})\n")
    results["sweep"] = sweep
    results["confidence_by_rule"] = chosen
    refused = memory_refusals(rows)
    print(f"memory false refusals (each deployment with its own concurrency and lengths): "
          f"{len(refused)} of {len(rows)}")
    for row, why in refused:
        print(f"  {row.source.id}: {row.point.locator}: {why}")
    results["memory_false_refusals"] = [{"source": r.source.id, "locator": r.point.locator,
                                         "reason": w} for r, w in refused]
    if json_out:
        json_out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    typer.run(main)
