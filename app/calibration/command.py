"""``llm-placement calibrate``: fit the serving model to measurements and print how good it is.

With no files it calibrates against the packaged corpus from the model's physical defaults, which
is how the shipped ``app/data/serving_calibration.yaml`` is made (so anyone can reproduce it).
With a user's own measurement files (the corpus format, or serving-benchmark results via
``--bench``) it starts from the shipped calibration and writes a file for the
``serving_calibration_file`` setting.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from app.calibration import corpus, fit
from app.calibration.bench_results import BenchmarkRows, bench_rows
from app.serving.model import (
    DEFAULT_CONFIDENCE,
    QUANTILE_LEVELS,
    ServingCalibration,
    default_calibration,
)

console = Console()


def render(title: str, stats: list[fit.GroupStats]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("group", "n", "median", "p10", "p90", "worst", "optimistic >1.3x",
                "pessimistic >1.3x", "within 0.7-1.4"):
        t.add_column(col, justify="left" if col == "group" else "right")
    for s in stats:
        t.add_row(s.group, str(s.n), f"{s.median:.2f}", f"{s.p10:.2f}", f"{s.p90:.2f}",
                  f"{s.worst:.2f}", str(s.optimistic), str(s.pessimistic), f"{s.within:.0%}")
    return t


def render_verdicts(title: str, rows: list[fit.Verdicts]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("metric", "group", "n", "factor (median)", f"false accepts at {fit.MISSED}x",
                f"false refusals at {fit.MET}x"):
        t.add_column(col, justify="left" if col in ("metric", "group") else "right")
    for v in rows:
        t.add_row(v.metric, v.group, str(v.n), f"{v.factor:.2f}", f"{v.false_accepts / v.n:.0%}",
                  f"{v.false_refusals / v.n:.0%}")
    return t


# A command's options are its parameters: the corpus fit's and the cluster refit's together.
def calibrate(  # noqa: PLR0913
    files: Annotated[list[Path] | None, typer.Argument(
        help="Measurement files or folders in the corpus format (default: the packaged corpus).")] = None,
    bench: Annotated[list[Path] | None, typer.Option(
        help="vLLM benchmark_serving --save-result JSON or SGLang bench_serving JSONL; needs "
             "--model, --gpu, --precision, --gpus.")] = None,
    model: Annotated[str | None, typer.Option(help="For --bench: model registry name.")] = None,
    gpu: Annotated[str | None, typer.Option(help="For --bench: GPU product.")] = None,
    precision: Annotated[str | None, typer.Option(help="For --bench: weights precision.")] = None,
    gpus: Annotated[int, typer.Option(min=1, help="For --bench: GPUs per replica.")] = 1,
    out: Annotated[Path | None, typer.Option(
        help="Write the fitted calibration here (the serving_calibration_file setting).")] = None,
    cross_validate: Annotated[bool, typer.Option(
        "--cross-validate/--no-cross-validate",
        help="Also judge the fit by leaving each source out in turn (slower).")] = True,
    cv_budget: Annotated[float, typer.Option(
        "--cv-budget", min=0.0,
        help="Seconds the cross-validation may take; folds not started by then are left out and "
             "named (0: no limit).")] = fit.CV_BUDGET_S,
    from_defaults: Annotated[bool, typer.Option(
        help="Start from the model's physical defaults rather than the shipped calibration "
             "(always so for the packaged corpus).")] = False,
    from_prometheus: Annotated[str | None, typer.Option(
        "--from-prometheus", metavar="URL", rich_help_panel="From your cluster",
        help="Refit the target decision's error distribution from what your engines measured: "
             "Prometheus's base URL (docs/stage-policy.md, \"Calibrating from your cluster\").")] = None,
    pods: Annotated[Path | None, typer.Option(
        rich_help_panel="From your cluster",
        help="With --from-prometheus: pods and nodes from `kubectl get pods,nodes -A -o yaml` "
             "instead of listing them from the cluster.")] = None,
    kubeconfig: Annotated[str | None, typer.Option(
        rich_help_panel="From your cluster", help="With --from-prometheus: the kubeconfig.")] = None,
    window: Annotated[str, typer.Option(
        rich_help_panel="From your cluster", help="Window of each mean (as live_profiles: 10m).")] = "10m",
    lookback: Annotated[str, typer.Option(
        rich_help_panel="From your cluster", help="How far back to read windows (7d, 12h).")] = "7d",
    min_requests: Annotated[float, typer.Option(
        min=1, rich_help_panel="From your cluster", help="Requests a window needs to count.")] = 100,
    steady_tolerance: Annotated[float, typer.Option(
        min=0.0, max=1.0, rich_help_panel="From your cluster",
        help="A window counts when the one before it is within this share.")] = 0.25,
    confidence: Annotated[float, typer.Option(
        min=QUANTILE_LEVELS[0], max=QUANTILE_LEVELS[-1], rich_help_panel="From your cluster",
        help="The serving_confidence the table judges at.")] = DEFAULT_CONFIDENCE,
    calibration: Annotated[Path | None, typer.Option(
        rich_help_panel="From your cluster",
        help="The calibration in use (serving_calibration_file; default: the shipped one).")] = None,
    timeout: Annotated[float, typer.Option(
        min=0.1, max=600, rich_help_panel="From your cluster", help="Seconds per Prometheus query.")] = 30.0,
    namespace_label: Annotated[str, typer.Option(
        rich_help_panel="From your cluster", help="Label holding the pod's namespace.")] = "namespace",
    pod_label: Annotated[str, typer.Option(
        rich_help_panel="From your cluster", help="Label holding the pod's name.")] = "pod",
) -> None:
    """Fit the serving model to measurements; print the error table before and after."""
    if from_prometheus is not None:
        if files or bench:
            Console(stderr=True).print("[red]--from-prometheus reads your cluster's engines: give no "
                                       "measurement files or --bench with it[/red]")
            raise typer.Exit(2)
        from app.calibration.from_prometheus import ClusterOptions
        from app.calibration.from_prometheus import main as from_cluster

        from_cluster(ClusterOptions(from_prometheus, kubeconfig, pods, window, lookback, min_requests,
                                    steady_tolerance, confidence, calibration, out, timeout,
                                    namespace_label, pod_label))
        return
    err = Console(stderr=True)
    try:
        rows = corpus.load(files) if files else ([] if bench else corpus.packaged())
        if bench:
            rows += bench_rows(BenchmarkRows(tuple(bench), model, gpu, precision, gpus))
    except (corpus.CorpusError, ValueError) as exc:
        err.print(f"[red]{escape(str(exc))}[/red]", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    if not rows:
        err.print("[red]no measurements to calibrate against[/red]")
        raise typer.Exit(2)
    packaged = not files and not bench
    start = ServingCalibration() if packaged or from_defaults else default_calibration()
    info = corpus.summary(rows)
    console.print(f"{info['points']} measurements from {info['sources']} sources; GPUs: "
                  f"{', '.join(info['gpus'])}; precisions: {', '.join(info['precisions'])}",
                  highlight=False)
    cv: list[fit.Ratio] = []
    validation: fit.CrossValidation | None = None
    if cross_validate and len({r.source.id for r in rows}) > 1:
        with Progress(console=err, transient=True) as bar:
            task = bar.add_task("cross-validation", total=len(fit.folds_of(rows)))
            validation = fit.cross_validation(rows, start, budget_s=cv_budget or None,
                                              progress=lambda _s: bar.advance(task))
        cv = validation.ratios
        console.print(escape(validation.describe()), highlight=False)
    provenance: dict[str, object] = {
        "made_by": "llm-placement calibrate" + ("" if packaged else " (user measurements)"),
        "date": date.today().isoformat(), **info}
    if validation is not None:
        provenance["cross_validation"] = validation.describe()
    if cv:
        # explain quotes these per pod: how far off the model was on similar published setups.
        provenance["cross_validated"] = {
            metric: {s.group: {"n": s.n, "median": round(s.median, 3), "p10": round(s.p10, 3),
                               "p90": round(s.p90, 3), "worst": round(s.worst, 3)}
                     for s in fit.table(cv, metric)}
            for metric in ("tpot", "ttft")}
    before = fit.predict(rows, start)
    fitted = fit.fit(rows, start, provenance=provenance)
    after = fit.predict(rows, fitted)
    # The filter's target check: the distribution of measured / estimate per group, from the
    # cross-validated errors (in-sample when there is a single source: narrower than it should be).
    errors = cv or after
    fitted = fitted.model_copy(update={
        "error_quantiles": fit.error_quantiles(
            errors, list(validation.unstated) if cv and validation is not None else
            fit.predict(rows, fitted, engine=False)),
        "provenance": {**fitted.provenance,
                       "error_quantiles_from": "cross-validated" if cv else "in-sample"}})
    for metric, label in (("tpot", "per output token"), ("ttft", "to first token")):
        console.print(render(f"estimate / measured, {label}: before (start values)",
                             fit.table(before, metric)))
        console.print(render(f"estimate / measured, {label}: after (fit to all)",
                             fit.table(after, metric)))
        if cv:
            console.print(render(f"estimate / measured, {label}: cross-validated (each source "
                                 "predicted by a fit to the others)", fit.table(cv, metric)))
    console.print(render_verdicts(
        f"target verdicts at {DEFAULT_CONFIDENCE:.0%} confidence over the "
        + ("cross-validated" if cv else "in-sample") + " errors (bench/serving_decisions.py judges "
        "each source with figures made without it)",
        fit.verdicts(errors, fit.quantile_factor(fitted, DEFAULT_CONFIDENCE))))
    text = yaml.safe_dump(fitted.model_dump(), sort_keys=False, width=1000)
    if out is None:
        console.print(escape(text), highlight=False)
        return
    out.write_text("# Written by `llm-placement calibrate`; docs/stage-policy.md, \"The serving model\".\n"
                   + text, encoding="utf-8")
    err.print(f"wrote {out}", highlight=False)
