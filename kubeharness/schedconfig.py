"""The scheduler configuration under test is the Helm chart's file, with only local overrides.

One source, no drift: ``helm/llm-placement/files/scheduler-config.yaml`` is what users install. The
harness changes only what cannot be the same on a loopback test control plane: the kubeconfig path,
leader election (one scheduler, no lease churn), the extender's port (chosen free at runtime) and, for
the parametrised test, ``nodeCacheCapable``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CHART_FILES = REPO_ROOT / "helm" / "llm-placement" / "files"
CHART_SCHEDULER_CONFIG = CHART_FILES / "scheduler-config.yaml"
CHART_EXTENDER_RBAC_RULES = CHART_FILES / "extender-rbac-rules.yaml"
PROFILE_NAME = "llm-placement"


class ChartFileError(RuntimeError):
    """A chart file the harness shares is missing or does not have the expected shape."""


def _read_yaml(path: Path, what: str) -> Any:
    if not path.is_file():
        raise ChartFileError(
            f"{what} not found at {path}. The integration suite runs kube-scheduler with the Helm chart's "
            f"own file (one source for the chart and the tests); it must exist before these tests can run."
        )
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ChartFileError(f"{what} at {path} is not valid YAML: {exc}") from exc


def load_chart_scheduler_config(path: Path = CHART_SCHEDULER_CONFIG) -> dict[str, Any]:
    """Read and sanity-check the chart's KubeSchedulerConfiguration."""
    doc = _read_yaml(path, "the chart's KubeSchedulerConfiguration")
    if not isinstance(doc, dict) or doc.get("kind") != "KubeSchedulerConfiguration":
        raise ChartFileError(f"{path}: expected kind KubeSchedulerConfiguration")
    if doc.get("apiVersion") != "kubescheduler.config.k8s.io/v1":
        raise ChartFileError(f"{path}: expected apiVersion kubescheduler.config.k8s.io/v1")
    names = [p.get("schedulerName") for p in doc.get("profiles") or []]
    if PROFILE_NAME not in names:
        raise ChartFileError(f"{path}: no profile with schedulerName {PROFILE_NAME!r} (found {names})")
    extenders = doc.get("extenders") or []
    if len(extenders) != 1 or "urlPrefix" not in extenders[0]:
        raise ChartFileError(f"{path}: expected exactly one extender with a urlPrefix, found {extenders!r}")
    return doc


def load_extender_rbac_rules(path: Path = CHART_EXTENDER_RBAC_RULES) -> list[dict[str, Any]]:
    """Read the PolicyRules the chart grants the extender."""
    rules = _read_yaml(path, "the chart's extender RBAC rules")
    if not isinstance(rules, list) or not rules or not all(isinstance(r, dict) for r in rules):
        raise ChartFileError(f"{path}: expected a non-empty YAML list of PolicyRule mappings")
    return rules


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost"):
        # The chart runs the extender as a sidecar reached on loopback; anything else would make the
        # harness talk to a host it does not control.
        raise ChartFileError(f"extender urlPrefix {url!r} is not a loopback URL")
    return urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path, parts.query, parts.fragment))


def local_scheduler_config(
    chart: dict[str, Any],
    *,
    kubeconfig: Path,
    extender_port: int,
    node_cache_capable: bool | None = None,
    with_extender: bool = True,
    client_connection: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The chart's config with the local overrides applied (the input is not modified).

    ``with_extender=False`` gives the same profile with no extenders at all: the baseline of the
    throughput benchmark. ``client_connection`` (e.g. qps/burst) is for benchmark exploration only.
    """
    cfg = copy.deepcopy(chart)
    cfg.setdefault("clientConnection", {}).update(client_connection or {})
    cfg["clientConnection"]["kubeconfig"] = str(kubeconfig)
    cfg.setdefault("leaderElection", {})["leaderElect"] = False
    if with_extender:
        for ext in cfg["extenders"]:
            ext["urlPrefix"] = _with_port(ext["urlPrefix"], extender_port)
            if node_cache_capable is not None:
                ext["nodeCacheCapable"] = node_cache_capable
    else:
        cfg.pop("extenders", None)
    return cfg


def extender_url_path(chart: dict[str, Any]) -> str:
    """The path part of the chart's urlPrefix, e.g. ``/scheduler`` (verbs are appended to it)."""
    return urlsplit(chart["extenders"][0]["urlPrefix"]).path.rstrip("/")


def write_yaml(path: Path, doc: Any) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def with_verbs_tls(ext: dict[str, Any], cert: Path, key: Path, ca: Path,
                   server_name: str | None = None) -> dict[str, Any]:
    """The extender entry over TLS with kube-scheduler's client certificate, the fields the chart
    sets (tests/deploy/test_chart.py checks the chart renders the same keys); ``server_name`` as
    the default-scheduler stanza sets it (the Service's DNS name)."""
    out = copy.deepcopy(ext)
    parts = urlsplit(out["urlPrefix"])
    out["urlPrefix"] = urlunsplit(("https", parts.netloc, parts.path, parts.query, parts.fragment))
    out["enableHTTPS"] = True
    out["tlsConfig"] = {"certFile": str(cert), "keyFile": str(key), "caFile": str(ca)}
    if server_name:
        out["tlsConfig"]["serverName"] = server_name
    return out
