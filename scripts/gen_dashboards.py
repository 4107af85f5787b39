#!/usr/bin/env python3
"""Dashboards and Prometheus rules as code: the single source of every query users look at.

    python scripts/gen_dashboards.py           # (re)write the generated files
    python scripts/gen_dashboards.py --check   # exit 1 and name the files that differ (CI, tests)

Writes, with identical content in each pair:
    deploy/grafana/<name>.json         and helm/llm-placement/dashboards/<name>.json
    deploy/prometheus/rules.yaml       and helm/llm-placement/files/prometheus-rules.yaml

Dashboards are built with grafana-foundation-sdk (Grafana's typed builders), pinned in the dev
dependencies because its output is committed and compared byte for byte. The rules are plain
Prometheus rule groups (``promtool check rules`` format); the chart wraps them in a PrometheusRule.

Conventions: gauges computed identically by every replica (cache sizes, cluster quality) are read with
``max`` so a warm-standby replica does not double them; counters are summed (only the active replica
counts anything). Every panel query is also checked against a real Prometheus scraping the real
extender (tests/prometheus/test_scrape.py), so a panel cannot reference a metric we do not export.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.builders import bargauge, stat, timeseries
from grafana_foundation_sdk.builders import dashboard as gdb
from grafana_foundation_sdk.builders import prometheus as gprom
from grafana_foundation_sdk.builders.common import StackingConfig
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import StackingMode
from grafana_foundation_sdk.models.dashboard import DashboardLinkType, DataSourceRef

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD_DIRS = (ROOT / "deploy" / "grafana", ROOT / "helm" / "llm-placement" / "dashboards")
RULE_FILES = (ROOT / "deploy" / "prometheus" / "rules.yaml",
              ROOT / "helm" / "llm-placement" / "files" / "prometheus-rules.yaml")
TAG = "llm-placement"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"  # Grafana picks a window of at least 4 scrape intervals

# Data-gravity distance labels (app.placement.gravity.Distance.label); "node" is co-located.
COLOCATED = 'distance="node"'
EDGE_KNOWN = 'distance!="missing"'


# --- panel model ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Q:
    """One query of a panel: PromQL and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class P:
    """One panel. ``kind``: timeseries, stat or bars (a bar gauge of an instant query)."""

    title: str
    description: str
    queries: tuple[Q, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    height: int = 8
    stacked: bool = False
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[P, ...]


@dataclass(frozen=True)
class Board:
    name: str  # file name without .json
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]


def quantiles(metric: str, by: str, qs: tuple[float, ...] = (0.5, 0.99), window: str = RATE) -> tuple[Q, ...]:
    """histogram_quantile queries of a histogram, one per quantile, grouped by ``by``."""
    group = f"le, {by}" if by else "le"
    legend = "{{" + by + "}}" if by else ""
    return tuple(
        Q(f"histogram_quantile({q:g}, sum by ({group}) (rate({metric}_bucket[{window}])))",
          f"p{q * 100:g} {legend}".strip())
        for q in qs
    )


def error_ratio(window: str) -> str:
    # "or 0 * requests" gives verbs without any error a 0 instead of no line at all.
    errors = f"sum by (verb) (rate(llm_placement_request_errors_total[{window}]))"
    requests = f"sum by (verb) (rate(llm_placement_request_duration_seconds_count[{window}]))"
    return f"({errors} or 0 * {requests}) / {requests}"


def agreement_ratio(window: str) -> str:
    """Share of binds on one of our best nodes (top or tied_top) among the ranked ones."""
    m = "llm_placement_scheduler_agreement_total"
    agreed = f'sum(increase({m}{{outcome=~"top|tied_top"}}[{window}]))'
    ranked = f'sum(increase({m}{{outcome!="unranked"}}[{window}]))'
    return f"{agreed} / {ranked}"


def colocated_ratio(window: str) -> str:
    edges = "llm_placement_dependency_edges_total"
    near = f"sum by (stage) (increase({edges}{{{COLOCATED}}}[{window}]))"
    every = f"sum by (stage) (increase({edges}[{window}]))"
    known = f"sum by (stage) (increase({edges}{{{EDGE_KNOWN}}}[{window}]))"
    return f"({near} or 0 * {every}) / {known}"


# --- the four dashboards ---------------------------------------------------------------------------
QUALITY = Board(
    "llm-placement-quality", "llmp-quality", "llm-placement / Placement quality",
    "How well pods fit where they were bound, per lifecycle stage: bandwidth and memory fit, latency "
    "against the SLO, what it costs, and whether consumers landed next to their data.",
    (
        Row("Fit at bind, per stage", (
            P("Bandwidth fit (median)",
              "Node memory bandwidth / bandwidth the max-ms-per-token SLO needs, for serving pods with an "
              "SLO. 1 = just enough; well above 1 = paying for speed nobody asked for.",
              quantiles("llm_placement_bandwidth_fit_ratio", "stage", (0.5,)), unit="none", min=0),
            P("Memory right-sizing (median and p10)",
              "Memory the pod needs / GPU memory it got. Near 1 is a tight fit; low values are expensive "
              "HBM left idle (a small model on a big GPU).",
              quantiles("llm_placement_memory_fit_ratio", "stage", (0.5, 0.1)), unit="percentunit",
              min=0),
            P("Predicted latency / SLO",
              "Predicted ms per token / max-ms-per-token at bind. Below 1 meets the SLO.",
              quantiles("llm_placement_predicted_latency_slo_ratio", "stage"), unit="none", min=0),
            P("Decisions by stage and outcome",
              "Filter and bind decisions per second: bound, unschedulable, invalid, bind_failed.",
              (Q("sum by (stage, outcome) (rate(llm_placement_decisions_total[" + RATE + "]))",
                 "{{stage}} {{outcome}}"),), unit="reqps"),
        )),
        Row("Cost", (
            P("Running $/hour by stage",
              "Estimated $/hour of the pods running now: each pod's share of its node's price.",
              (Q("max by (stage) (llm_placement_running_hourly_cost_dollars)", "{{stage}}"),),
              unit="currencyUSD", stacked=True, min=0),
            P("$/hour bound in the last hour, by stage",
              "Sum of the $/hour of every pod bound in the trailing hour: new spend committed.",
              (Q("sum by (stage) (increase(llm_placement_bound_hourly_cost_dollars_total[1h]))",
                 "{{stage}}"),), unit="currencyUSD", min=0),
            P("GPUs bound in the last hour, by stage and model",
              "GPUs bound in the trailing hour, by stage and catalog GPU model.",
              (Q("sum by (stage, gpu) (increase(llm_placement_bound_gpus_total[1h]))", "{{stage}} {{gpu}}"),),
              width=24, min=0),
        )),
        Row("Data gravity", (
            P("Co-located dependency fraction",
              "Of the depends-on edges bound in the trailing hour whose producer was found, the share "
              "placed on the producer's node.",
              (Q(colocated_ratio("1h"), "{{stage}}"),), unit="percentunit", min=0, max=1),
            P("Dependency edges by distance (last hour)",
              "Edges bound in the trailing hour by distance to the producer: node, nvlink, fabric, zone, "
              "cross-zone, or missing (producer not found).",
              (Q("sum by (distance) (increase(llm_placement_dependency_edges_total[1h]))", "{{distance}}"),),
              stacked=True, min=0),
            P("Cross-node data (GB, last hour)",
              "Estimated GB consumers will read from producers on other nodes, bound in the trailing hour.",
              (Q("sum by (stage) (increase(llm_placement_cross_node_data_gigabytes_total[1h]))",
                 "{{stage}}"),), unit="decgbytes", width=24, min=0),
        )),
    ),
)

GANGS = Board(
    "llm-placement-gangs", "llmp-gangs", "llm-placement / Gangs",
    "All-or-nothing gangs: CP-SAT planning time and status, how long gangs wait, and the GPUs their "
    "reservations hold.",
    (
        Row("Solver", (
            P("Solver time by status", "CP-SAT gang plan time, p50 and p99, by solver status.",
              quantiles("llm_placement_solver_duration_seconds", "status"), unit="s", min=0),
            P("Solver runs by status", "Gang plans per second by CP-SAT status.",
              (Q("sum by (status) (rate(llm_placement_solver_runs_total[" + RATE + "]))", "{{status}}"),),
              unit="ops", min=0),
        )),
        Row("Waiting and reservations", (
            P("Gang wait", "Time from a gang's first filter call until every member is bound.",
              quantiles("llm_placement_gang_wait_seconds", ""), unit="s", min=0),
            P("Reserved GPUs", "GPUs held by gang reservations not bound yet (other pods see them as taken).",
              (Q("max(llm_placement_reserved_gpus)", "reserved"),), min=0),
            P("Reservations expired (last hour)",
              "Reservations dropped at their TTL in the trailing hour: gangs that could not complete.",
              (Q("sum(increase(llm_placement_reservations_expired_total[1h]))", "expired"),), min=0),
            P("Gangs by outcome (last hour)", "Gangs bound, failed or replanned in the trailing hour.",
              (Q("sum by (outcome) (increase(llm_placement_gangs_total[1h]))", "{{outcome}}"),), min=0),
        )),
    ),
)

EXTENDER = Board(
    "llm-placement-extender", "llmp-extender", "llm-placement / Extender health",
    "The extender on kube-scheduler's synchronous path: traffic, latency, errors, decisions, and the "
    "health of its watch-fed cache.",
    (
        Row("Requests", (
            P("Requests by verb", "Extender calls per second by verb (filter, prioritize, bind, preempt).",
              (Q("sum by (verb) (rate(llm_placement_request_duration_seconds_count[" + RATE + "]))",
                 "{{verb}}"),), unit="reqps", min=0),
            P("Latency by verb (p50, p99)",
              "Time inside the extender per call. Filter and prioritize target p99 <= 5 ms.",
              quantiles("llm_placement_request_duration_seconds", "verb"), unit="s", min=0),
            P("Errors by verb and kind",
              "Calls answered with an Error: malformed input, internal failure, refused bind, too large.",
              (Q("sum by (verb, kind) (rate(llm_placement_request_errors_total[" + RATE + "]))",
                 "{{verb}} {{kind}}"),), unit="reqps", min=0),
            P("Error ratio by verb", "Errors / calls per verb. kube-scheduler ignores prioritize errors "
              "silently, so this is the only place they show.",
              (Q(error_ratio(RATE), "{{verb}}"),), unit="percentunit", min=0),
        )),
        Row("Decisions", (
            P("Decisions by outcome", "Placement decisions per second by outcome.",
              (Q("sum by (outcome) (rate(llm_placement_decisions_total[" + RATE + "]))", "{{outcome}}"),),
              unit="reqps", stacked=True, min=0),
            P("Node rejections by rule", "Nodes rejected in filter per second, by the rejecting rule.",
              (Q("sum by (rule) (rate(llm_placement_node_rejections_total[" + RATE + "]))", "{{rule}}"),),
              unit="reqps", stacked=True, min=0),
            P("Invalid annotations by key (last hour)",
              "Pods whose llm-placement annotations could not be understood, by annotation key. The pod "
              "carries the exact message in its events.",
              (Q("sum by (key) (increase(llm_placement_invalid_annotations_total[1h]))", "{{key}}"),),
              min=0),
            P("kube-scheduler agreement",
              "Share of binds on one of our best-ranked nodes (top or tied_top) in the last hour. Below "
              "99%, kube-scheduler's in-tree scores outweigh our bands: check the profile's score "
              "plugins and the extender weight (docs/scoring.md).",
              (Q(agreement_ratio("1h"), "agreement"),), kind="stat", unit="percentunit", width=6),
            P("Binds by agreement outcome",
              "How the node kube-scheduler bound ranked in our prioritize scores: top, tied_top, lower "
              "(in-tree points won), unranked (no ranking remembered: restart, or one-node cycles).",
              (Q("sum by (outcome) (rate(llm_placement_scheduler_agreement_total[" + RATE + "]))",
                 "{{outcome}}"),), unit="reqps", stacked=True, min=0),
            P("Nodes with unknown GPU models",
              "Nodes whose GPU product is missing from the catalog (used conservatively).",
              (Q("max(llm_placement_unknown_gpu_nodes)", "nodes"),), kind="stat", width=12),
        )),
        Row("Cache", (
            P("Cache size", "Nodes and pods in the extender's watch-fed cache.",
              (Q("max(llm_placement_cache_nodes)", "nodes"), Q("max(llm_placement_cache_pods)", "pods")),
              min=0),
            P("Watch restarts (last hour)", "Watch streams restarted in the trailing hour, by resource and "
              "cause (gone: re-list after 410; error: reconnect).",
              (Q("sum by (resource, cause) (increase(llm_placement_watch_restarts_total[1h]))",
                 "{{resource}} {{cause}}"),), min=0),
        )),
    ),
)

FRAGMENTATION = Board(
    "llm-placement-fragmentation", "llmp-fragmentation", "llm-placement / Cluster fragmentation",
    "Where the free GPUs are: per NVLink domain and GPU model, how many sit stranded beside busy ones, "
    "and what is waiting for them. Definitions: app/metrics/quality.py.",
    (
        Row("Free capacity", (
            P("Free GPUs by model", "Free GPUs on schedulable nodes (minus gang reservations), per model.",
              (Q("sum by (gpu) (max by (domain, gpu) (llm_placement_free_gpus))", "{{gpu}}"),),
              stacked=True, min=0),
            P("GPU allocation by model", "Share of each model's GPUs that are used or reserved.",
              (Q("1 - sum by (gpu) (max by (domain, gpu) (llm_placement_free_gpus)) / "
                 "max by (gpu) (llm_placement_allocatable_gpus)", "{{gpu}}"),),
              unit="percentunit", min=0, max=1),
            P("Free GPUs by NVLink domain (top 20)",
              "The 20 NVLink domains with the most free GPUs: a gang that needs one block must fit in one.",
              (Q("topk(20, max by (domain, gpu) (llm_placement_free_gpus))", "{{domain}} ({{gpu}})"),),
              kind="bars", width=24, height=10, min=0),
        )),
        Row("Fragmentation", (
            P("Stranded GPUs by model",
              "Free GPUs on partly used nodes with fewer free GPUs than any pending GPU pod requests.",
              (Q("max by (gpu) (llm_placement_stranded_gpus)", "{{gpu}}"),), stacked=True, min=0),
            P("Fragmentation ratio by model",
              "Free GPUs beside busy ones / all free GPUs. 0: every free GPU is in an empty node.",
              (Q("max by (gpu) (llm_placement_gpu_fragmentation_ratio)", "{{gpu}}"),),
              unit="percentunit", min=0, max=1),
            P("Pending GPU demand", "GPUs requested by known pods that are not bound yet.",
              (Q("max(llm_placement_pending_gpus)", "pending GPUs"),), min=0),
            P("Free vs pending GPUs", "All free GPUs against the GPUs pending pods ask for.",
              (Q("sum(max by (domain, gpu) (llm_placement_free_gpus))", "free"),
               Q("max(llm_placement_pending_gpus)", "pending")), min=0),
        )),
    ),
)

BOARDS = (QUALITY, GANGS, EXTENDER, FRAGMENTATION)


def _panel(p: P, pid: int) -> Any:
    if p.kind == "stat":
        b: Any = stat.Panel()
    elif p.kind == "bars":
        b = bargauge.Panel()
    else:
        b = timeseries.Panel().fill_opacity(10).line_width(1)
        if p.stacked:
            b = b.stacking(StackingConfig().mode(StackingMode.NORMAL))
    b = (b.id(pid).title(p.title).description(p.description).datasource(DS).unit(p.unit)
         .span(p.width).height(p.height))
    if p.min is not None:
        b = b.min(p.min)
    if p.max is not None:
        b = b.max(p.max)
    for i, q in enumerate(p.queries):
        t = gprom.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(ord("A") + i)).datasource(DS)
        if p.kind in ("stat", "bars"):
            t = t.instant()
        b = b.with_target(t)
    return b


def build_dashboard(board: Board) -> dict[str, Any]:
    d = (gdb.Dashboard(board.title).uid(board.uid).description(board.description).tags([TAG])
         .refresh("30s").time("now-6h", "now").timezone("browser").editable()
         .with_variable(gdb.DatasourceVariable("datasource").label("Data source").type("prometheus"))
         .link(gdb.DashboardLink("llm-placement").type(DashboardLinkType.DASHBOARDS).tags([TAG])
               .as_dropdown(True).keep_time(True).include_vars(True)))
    pid = 1
    for row in board.rows:
        d = d.with_row(gdb.Row(row.title).id(pid))
        pid += 1
        for p in row.panels:
            d = d.with_panel(_panel(p, pid))
            pid += 1
    data: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    return data


# --- rules ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    record: str
    expr: str


@dataclass(frozen=True)
class Alert:
    """An alert; ``signal`` is the part of ``expr`` that must return data for the alert to be
    meaningful (the test checks it against a real Prometheus), ``expr`` adds the threshold."""

    alert: str
    signal: str
    condition: str
    for_: str
    severity: str
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def expr(self) -> str:
        return f"{self.signal} {self.condition}"


RECORDS = (
    Record("llm_placement:request_duration_seconds:p99_rate5m",
           quantiles("llm_placement_request_duration_seconds", "verb", (0.99,), "5m")[0].expr),
    Record("llm_placement:request_duration_seconds:p50_rate5m",
           quantiles("llm_placement_request_duration_seconds", "verb", (0.5,), "5m")[0].expr),
    Record("llm_placement:request_errors:ratio_rate5m", error_ratio("5m")),
    Record("llm_placement:dependency_edges_colocated:ratio_rate1h", colocated_ratio("1h")),
    Record("llm_placement:stranded_gpus:ratio",
           "max by (gpu) (llm_placement_stranded_gpus) / max by (gpu) (llm_placement_allocatable_gpus)"),
    Record("llm_placement:scheduler_agreement:ratio_rate1h", agreement_ratio("1h")),
    Record("llm_placement:gang_wait_seconds:p99_rate15m",
           quantiles("llm_placement_gang_wait_seconds", "", (0.99,), "15m")[0].expr),
)

ALERTS = (
    Alert("LLMPlacementExtenderErrors", "llm_placement:request_errors:ratio_rate5m", "> 0.05", "10m",
          "warning", "llm-placement {{ $labels.verb }} errors: {{ $value | humanizePercentage }} of calls",
          "More than 5% of {{ $labels.verb }} calls answered with an Error for 10 minutes. Filter errors "
          "leave pods pending; prioritize errors are ignored by kube-scheduler (placement falls back to "
          "its own scoring); bind errors fail the binding. See the extender's log and "
          "llm_placement_request_errors_total{kind}."),
    Alert("LLMPlacementFilterLatencyHigh",
          'llm_placement:request_duration_seconds:p99_rate5m{verb=~"filter|prioritize"}', "> 0.005", "15m",
          "warning", "llm-placement {{ $labels.verb }} p99 is {{ $value | humanizeDuration }}",
          "The p99 of {{ $labels.verb }} inside the extender exceeded 5 ms for 15 minutes. These calls "
          "sit on kube-scheduler's synchronous path, so every pod's scheduling slows down. Check CPU "
          "throttling of the extender container and the cache size (llm_placement_cache_pods)."),
    Alert("LLMPlacementGangWaitHigh", "llm_placement:gang_wait_seconds:p99_rate15m", "> 600", "15m",
          "warning", "Gangs wait {{ $value | humanizeDuration }} (p99) to be fully bound",
          "The p99 time from a gang's first filter call to all members bound exceeded 10 minutes. Look "
          "at the gang's pod events (llm-placement explain) for the dominant reason, and at the "
          "fragmentation dashboard: capacity may exist but not in one domain."),
    Alert("LLMPlacementSchedulerDisagrees", "llm_placement:scheduler_agreement:ratio_rate1h",
          '< 0.99 and on () sum(increase(llm_placement_scheduler_agreement_total{outcome="lower"}[1h])) '
          ">= 5", "30m", "warning",
          "kube-scheduler followed llm-placement's ranking in only "
          "{{ $value | humanizePercentage }} of binds",
          "For 30 minutes fewer than 99% of binds (and at least 5 in the last hour) landed on one of the "
          "extender's best nodes: kube-scheduler's in-tree scores outweigh the extender's bands, so "
          "packing, cost and data-gravity preferences are being lost. Check that the profile disables "
          "the resource score plugins and that one band (extender weight x 10) exceeds the in-tree "
          "points that vary (docs/scoring.md)."),
    Alert("LLMPlacementStrandedGPUs", "llm_placement:stranded_gpus:ratio",
          "> 0.1 and on (gpu) max by (gpu) (llm_placement_stranded_gpus) >= 8", "30m", "warning",
          "{{ $value | humanizePercentage }} of {{ $labels.gpu }} GPUs are stranded",
          "For 30 minutes more than 10% (and at least 8) of the {{ $labels.gpu }} GPUs sat free on partly "
          "used nodes that no pending pod can use by GPU count. Pending gangs wait while capacity idles; "
          "consider draining small jobs off partly used nodes or adding packing weight."),
    Alert("LLMPlacementInvalidAnnotations",
          "sum by (key) (increase(llm_placement_invalid_annotations_total[15m]))", "> 0", "15m", "info",
          "Pods keep arriving with an invalid llm-placement.io/{{ $labels.key }} annotation",
          "For 15 minutes kube-scheduler kept sending pods whose {{ $labels.key }} annotation cannot be "
          "understood; they stay pending. Their events carry the exact message "
          "(kubectl get events --field-selector reason=FailedScheduling)."),
    Alert("LLMPlacementUnknownGPUModels", "max(llm_placement_unknown_gpu_nodes)", "> 0", "30m", "info",
          "{{ $value }} nodes have GPU models missing from the llm-placement catalog",
          "Nodes advertise GPUs whose product label is not in the catalog; sized LLM workloads avoid "
          "them. Add the product to the catalog or annotate the nodes with "
          "llm-placement.io/gpu-memory-bandwidth and nvidia.com/gpu.memory."),
    Alert("LLMPlacementServingTargetsMissed", "max by (metric) (llm_placement_serving_targets_missed)",
          "> 0", "30m", "warning",
          "{{ $value }} serving pods miss their own {{ $labels.metric }} target, as their engines measure it",
          "For 30 minutes, serving engines measured pods above their own max-ms-per-token (tpot) or "
          "max-ttft-ms (ttft) over two steady windows. Which pods: their ServingTargetMissed events "
          "(kubectl get events -A --field-selector reason=ServingTargetMissed) and llm-placement explain. "
          "The filter admitted them on an estimate this cluster's engines do not reach: refit the error "
          "distribution from the cluster (llm-placement calibrate --from-prometheus) or raise "
          "serving_confidence (docs/stage-policy.md, \"Targets the engines measure missed\")."),
    # Gang members behind the chart's gang gate are never tried by kube-scheduler, and only the
    # extender lifts the gate and writes their events: with no replica up they wait with no word
    # on the pod (docs/gangs.md, "Held at admission"), so the word goes to the operator. `absent`
    # covers a Deployment with no pod left to scrape; `max` lets one live replica of two suffice.
    Alert("LLMPlacementExtenderDown",
          'max(up{job=~".*llm-placement.*"})', '< 1 or absent(up{job=~".*llm-placement.*"})', "5m",
          "critical",
          "No llm-placement extender has answered a scrape for 5 minutes",
          "kube-scheduler's calls to the extender fail, so GPU pods are not placed, and gang members "
          "held by the gang gate stay gated with no event until a replica is back (docs/gangs.md, "
          "\"Held at admission\"). Check the extender's pods and logs; run two replicas in "
          "`mode: scheduler` for a warm standby."),
    Alert("LLMPlacementWatchRestarts",
          "sum by (resource) (increase(llm_placement_watch_restarts_total[15m]))", "> 5", "15m", "warning",
          "llm-placement's {{ $labels.resource }} watch restarted {{ $value }} times in 15 minutes",
          "The extender's cache keeps losing its watch on {{ $labels.resource }}; its view of the cluster "
          "may lag. Check API server health and the extender's network policy."),
)


def rule_groups() -> dict[str, Any]:
    return {
        "groups": [
            {"name": "llm-placement.records",
             "rules": [{"record": r.record, "expr": r.expr} for r in RECORDS]},
            {"name": "llm-placement.alerts",
             "rules": [
                 {"alert": a.alert, "expr": a.expr, "for": a.for_,
                  "labels": {"severity": a.severity, **a.labels},
                  "annotations": {"summary": a.summary, "description": a.description}}
                 for a in ALERTS
             ]},
        ]
    }


# --- rendering ----------------------------------------------------------------------------------------
RULES_HEADER = (
    "# Generated by scripts/gen_dashboards.py: edit the definitions there and re-run it.\n"
    "# Plain Prometheus rule groups (promtool check rules); the Helm chart wraps the same groups in a\n"
    "# PrometheusRule. Unit tests: tests/prometheus/rules_test.yaml (promtool test rules).\n"
)


def render_dashboard(board: Board) -> str:
    return json.dumps(build_dashboard(board), indent=2, sort_keys=True) + "\n"


class _RulesDumper(yaml.SafeDumper):
    """Long strings as folded blocks (``>-``): one logical line, readable in a review."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = ">" if len(value) > 80 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_RulesDumper.add_representer(str, _str)


def render_rules() -> str:
    body = yaml.dump(rule_groups(), Dumper=_RulesDumper, sort_keys=False, width=100, allow_unicode=True)
    return RULES_HEADER + body


def outputs() -> Iterator[tuple[Path, str]]:
    for board in BOARDS:
        text = render_dashboard(board)
        for d in DASHBOARD_DIRS:
            yield d / f"{board.name}.json", text
    rules = render_rules()
    for path in RULE_FILES:
        yield path, rules


def panel_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expr) for every query of every panel, rows included (for the tests)."""
    stack = list(dashboard.get("panels") or [])
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels") or [])
        for target in panel.get("targets") or []:
            if target.get("expr"):
                yield panel.get("title", ""), target["expr"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on drift")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print("out of date (run scripts/gen_dashboards.py):", *(str(p.relative_to(ROOT)) for p in stale),
              sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
