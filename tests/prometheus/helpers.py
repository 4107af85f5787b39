"""What the Prometheus-side tests share: the generator, every query it emits, and what we export."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client.metrics import MetricWrapperBase

from app.metrics.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "scripts" / "gen_dashboards.py"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
CHART_RULES = ROOT / "helm" / "llm-placement" / "files" / "prometheus-rules.yaml"
RULES_TEST = Path(__file__).resolve().parent / "rules_test.yaml"
METRIC_RE = re.compile(r"\b(llm_placement_[a-z0-9_]+|llm_placement:[a-z0-9_:]+)\b")
INSTALL_HINT = "apt-get install -y --no-install-recommends prometheus  (Debian; brings promtool too)"


@cache
def generator() -> ModuleType:
    """scripts/gen_dashboards.py as a module (it is a script, not part of the package)."""
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ImportError:
        pytest.fail("grafana-foundation-sdk is not installed: pip install -e '.[dev]'", pytrace=False)
    spec = importlib.util.spec_from_file_location("gen_dashboards", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Query:
    where: str  # "dashboard <name> / panel <title>", "record <name>", "alert <name>"
    expr: str


def all_queries() -> list[Query]:
    """Every PromQL expression users see: each dashboard panel's, each recording rule's, and each
    alert's signal (the part before its threshold) and full condition."""
    gen = generator()
    out: list[Query] = []
    for board in gen.BOARDS:
        for title, expr in gen.panel_queries(gen.build_dashboard(board)):
            out.append(Query(f"dashboard {board.name} / panel {title!r}", expr))
    for r in gen.RECORDS:
        out.append(Query(f"record {r.record}", r.expr))
    for a in gen.ALERTS:
        out.append(Query(f"alert {a.alert} (signal)", a.signal))
    return out


def metric_attrs() -> dict[str, str]:
    """Exported sample name -> Metrics attribute, for every sample name a series can carry."""
    m = Metrics()
    out: dict[str, str] = {}
    for attr, obj in vars(m).items():
        if not isinstance(obj, MetricWrapperBase):
            continue
        name, kind = obj._name, obj._type  # public API has no accessor for these
        if kind == "counter":
            names = [f"{name}_total", f"{name}_created"]
        elif kind == "histogram":
            names = [f"{name}_bucket", f"{name}_count", f"{name}_sum", f"{name}_created"]
        else:
            names = [name]
        out.update(dict.fromkeys(names, attr))
    return out


def referenced(expr: str) -> set[str]:
    """Metric and recording-rule names an expression reads."""
    return set(METRIC_RE.findall(expr))


def recorded_in_app(attr: str) -> bool:
    """Does any module of app/ (besides the definitions) record into ``Metrics.<attr>``?"""
    pattern = re.compile(rf"\.{re.escape(attr)}\b\s*\.\s*(labels|inc|observe|set|remove)\b")
    for path in (ROOT / "app").rglob("*.py"):
        if path.name == "metrics.py":
            continue
        if pattern.search(path.read_text()):
            return True
    return False


def need_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH; install it: {INSTALL_HINT}", pytrace=False)
    return path
