"""``llm-placement calibrate --from-prometheus URL``: refit the serving decision's error distribution
from what the cluster's own engines measured (docs/stage-policy.md, "Calibrating from your cluster").

Reads the learnt profiles' windows back from Prometheus over a look-back period, attributes each pod's
series to its annotations and GPU (from the cluster, or from ``kubectl get pods,nodes -A -o yaml``),
prints the before / after table of false refusals and false accepts, and writes a calibration file
for the ``serving_calibration_file`` setting. Every failure is one line on stderr and exit status 2.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from app.base.catalog import GpuCatalog
from app.base.datafile import load_user_yaml
from app.calibration import cluster_errors as ce
from app.cluster.prometheus_history import HistoryReader
from app.cluster.serving_metrics import PrometheusError, Source
from app.config.policy import LearnPolicy
from app.serving.live_profiles import ENGINE_NAMES
from app.serving.model import MIN_GROUP_POINTS, ServingCalibration, default_calibration

MAX_PODS_FILE_BYTES = 64 << 20  # a cluster's pods and nodes as kubectl prints them
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class CalibrateError(ValueError):
    """What went wrong, in one line for the user."""


def duration(text: str, what: str) -> float:
    """``600``, ``10m``, ``6h``, ``7d`` -> seconds."""
    m = _DURATION.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise CalibrateError(f"{what}: {text!r} is not a duration (600, 10m, 6h, 7d)")
    return float(m.group(1)) * _UNIT_S[m.group(2) or "s"]


def check_url(url: str) -> str:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise CalibrateError(f"--from-prometheus: {url!r} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise CalibrateError(f"--from-prometheus: {url!r} is not an http(s) URL of Prometheus "
                             "(e.g. http://prometheus.monitoring:9090)")
    return url


def objects_from_file(path: Path) -> list[dict[str, Any]]:
    """Pods and nodes from ``kubectl get pods,nodes -A -o yaml`` (or ``-o json``): a List, or a list."""
    data = load_user_yaml(path, CalibrateError, MAX_PODS_FILE_BYTES)
    items = data.get("items") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise CalibrateError(f"{path}: expected a List of pods and nodes "
                             "(kubectl get pods,nodes -A -o yaml)")
    return [i for i in items if isinstance(i, dict)]


def objects_from_cluster(kubeconfig: str | None) -> list[dict[str, Any]]:
    """Every pod and node, as the extender's watch lists them (list items carry no kind: set it)."""
    from kubernetes import client

    from app.cluster.client import CredentialsError, api_client, list_all

    try:
        core = client.CoreV1Api(api_client(kubeconfig))
        pods, _ = list_all(core.list_pod_for_all_namespaces)
        nodes, _ = list_all(core.list_node)
    except CredentialsError as exc:
        raise CalibrateError(str(exc)) from None
    except Exception as exc:  # ApiException, connection refused, TLS: one line, no traceback
        detail = " ".join(str(exc).split())[:300]
        raise CalibrateError(f"cannot list pods and nodes from the cluster: {type(exc).__name__}: "
                             f"{detail} (or pass --pods FILE)") from None
    return [{**p, "kind": "Pod"} for p in pods] + [{**n, "kind": "Node"} for n in nodes]


def render(rows: list[ce.Row], confidence: float) -> Table:
    t = Table(title=f"target verdicts on this cluster at {confidence:.0%} confidence: before (the "
                    "calibration in use) and after (each pod judged by a refit without its own "
                    "windows)", title_justify="left")
    # A false refusal: a target set at 1.2x the measurement, refused; a false accept: one at 0.75x,
    # accepted (docs/stage-policy.md, "Target decision").
    for col in ("metric", "group", "windows", "pods", "quantile before",
                f"false refusals {ce.MET}x", f"false accepts {ce.MISSED}x", "quantile after",
                f"false refusals {ce.MET}x ", f"false accepts {ce.MISSED}x "):
        t.add_column(col, justify="left" if col in ("metric", "group") or col.startswith("quantile")
                     else "right")
    for r in rows:
        t.add_row(r.metric, r.group, str(r.points), str(r.pods), r.before, f"{r.before_refusals:.0%}",
                  f"{r.before_accepts:.0%}", r.after, f"{r.after_refusals:.0%}", f"{r.after_accepts:.0%}")
    return t


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterOptions:
    """The command line of ``calibrate --from-prometheus`` (app/calibration/command.py)."""

    url: str
    kubeconfig: str | None = None
    pods_file: Path | None = None
    window: str = "10m"
    lookback: str = "7d"
    min_requests: float = 100.0
    steady_tolerance: float = 0.25
    confidence: float = 0.7
    calibration: Path | None = None
    out: Path | None = None
    timeout: float = 30.0
    namespace_label: str = "namespace"
    pod_label: str = "pod"


def run(o: ClusterOptions, console: Console, err: Console) -> None:
    """The whole command; raises CalibrateError for anything the user must fix."""
    from app.config.settings import Settings

    check_url(o.url)
    window_s, lookback_s = duration(o.window, "--window"), duration(o.lookback, "--lookback")
    try:
        start, end = ce.range_bounds(time.time(), lookback_s, window_s)
    except ValueError as exc:
        raise CalibrateError(str(exc)) from None
    try:
        cal = ServingCalibration.load(o.calibration) if o.calibration else default_calibration()
    except (ValueError, OSError) as exc:
        raise CalibrateError(f"--calibration: {exc}") from None
    settings = Settings(cluster_source="none")
    policies = settings.policies()
    defaults = dataclasses.replace(policies.placement.feasibility, serving=cal)
    objects = objects_from_file(o.pods_file) if o.pods_file else objects_from_cluster(o.kubeconfig)
    catalog = GpuCatalog.load()
    gpu_resources = tuple(settings.labels.gpu_resource)
    pods = ce.pod_table(objects, catalog, policies.node_facts, gpu_resources)

    reader = HistoryReader(Source(o.url, o.timeout, window_s, o.namespace_label, o.pod_label))
    try:
        history = reader.history(start, end)
    except PrometheusError as exc:
        raise CalibrateError(f"cannot read Prometheus: {exc}") from None
    if not history:
        raise CalibrateError(
            f"{o.url}: no serving-engine latency series ({', '.join(ENGINE_NAMES)}) with "
            f"'{o.namespace_label}' and '{o.pod_label}' labels in the last {o.lookback}: are the engines "
            "scraped, and do the labels match (--namespace-label, --pod-label)?")
    known = [f"{ns}/{pod}" for ns, pod in history if f"{ns}/{pod}" in pods]
    if not known:
        shown = ", ".join(sorted(f"{ns}/{pod}" for ns, pod in history)[:3])
        raise CalibrateError(
            f"{len(history)} pod(s) have engine series (e.g. {shown}), but none is a running GPU "
            "serving pod with model-params on a node of a known GPU in "
            + (str(o.pods_file) if o.pods_file else "the cluster"))
    policy = LearnPolicy(min_requests=o.min_requests, steady_tolerance=o.steady_tolerance,
                         window_seconds=window_s)
    points = ce.steady_points(history, pods.get, defaults, policy)
    if not points:
        raise CalibrateError(
            f"{len(known)} serving pod(s) measured, but no steady window in the last {o.lookback}: "
            f"each needs {o.min_requests:g} requests per {o.window} and the window before it within "
            f"{o.steady_tolerance:.0%} (--min-requests, --steady-tolerance, --lookback)")
    refitted, replaced = ce.refit(cal, points)
    before = ce.judge_before(cal, points, o.confidence)
    after = ce.judge_after(cal, points, o.confidence)
    console.print(f"{len(points)} steady windows from {len({p.pod for p in points})} pods "
                  f"({', '.join(sorted({p.engine for p in points}))}) over the last {o.lookback}, "
                  f"{o.window} windows", highlight=False)
    console.print(render(ce.rows(before, after), o.confidence))
    if replaced:
        console.print("refitted from this cluster: " + ", ".join(
            f"{m} {escape(g)} ({n})" for m, g, n in replaced), highlight=False)
    else:
        err.print(f"[yellow]no group has {MIN_GROUP_POINTS} steady windows of one metric yet: the "
                  "distribution is unchanged (a longer --lookback gives more)[/yellow]", highlight=False)
    provenance = {
        **refitted.provenance,
        "from_prometheus": {
            "made_by": "llm-placement calibrate --from-prometheus", "date": date.today().isoformat(),
            "window": o.window, "lookback": o.lookback, "min_requests": o.min_requests,
            "steady_tolerance": o.steady_tolerance, "windows": len(points),
            "pods": len({p.pod for p in points}),
            "replaced": [{"metric": m, "group": g, "n": n} for m, g, n in replaced]},
    }
    refitted = refitted.model_copy(update={"provenance": json.loads(json.dumps(provenance))})
    text = yaml.safe_dump(refitted.model_dump(), sort_keys=False, width=1000)
    if o.out is None:
        console.print(escape(text), highlight=False)
        return
    try:
        o.out.write_text("# Written by `llm-placement calibrate --from-prometheus`; "
                         "docs/stage-policy.md, "
                         "\"Calibrating from your cluster\".\n" + text, encoding="utf-8")
    except OSError as exc:
        raise CalibrateError(f"--out: cannot write {o.out}: {exc.strerror or exc}") from None
    err.print(f"wrote {o.out} (the serving_calibration_file setting)", highlight=False)


def main(options: ClusterOptions) -> None:
    err = Console(stderr=True)
    try:
        run(options, Console(), err)
    except CalibrateError as exc:
        err.print(f"[red]{escape(' '.join(str(exc).split()))}[/red]", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
